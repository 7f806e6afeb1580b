//! Frontends that attack the switch through what they control — their interrupt and kick
//! descriptors, the messages on their socket, their memory files — harm only their own port:
//! each is refused or cut off, its port says why, and the port beside it forwards all along
//! (a ring port "r0" and a well-behaved guest in one bridge domain, stepped by the test: a
//! step that hung would be the switch's PMD thread hanging).

#[path = "common/bridged.rs"]
mod bridged;
#[path = "common/frontend.rs"]
mod frontend;

use bridged::{bridged, exchange, scratch, wait_for};
use frontend::{frontend, memfd, set_up_on};
use knitter_vhost::backend::serve;
use knitter_vhost::testkit::{Buf, MEM_LEN};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};
use vhost::vhost_user::message::{VhostUserHeaderFlag, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo};
use vmm_sys_util::eventfd::EventFd;
use vswitch::port::Port;
use vswitch::testkit::{frames, mac};

/// A pipe's write end, dressed as an eventfd for rust-vmm's frontend (which sends any
/// descriptor it is given).
fn pipe_end() -> (OwnedFd, EventFd) {
    let mut p = [0; 2];
    // SAFETY: pipe fills our two-element array.
    assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
    // SAFETY: fresh descriptors, each owned once.
    unsafe { (OwnedFd::from_raw_fd(p[0]), EventFd::from_raw_fd(p[1])) }
}

/// An interrupt or kick descriptor that is not an eventfd is refused with the port in error
/// (it would block the PMD thread once its pipe filled); the frontend reconnecting with
/// eventfds works again.
#[test]
fn descriptors_that_are_not_eventfds_are_refused() {
    let dir = scratch("hostile-fd");
    let (mut h, ports) = bridged(&["good", "bad"]);
    let (good, bad) = (ports[0].clone(), ports[1].clone());
    let _servers = [
        serve(&dir.join("good.sock"), good.clone()).unwrap(),
        serve(&dir.join("bad.sock"), bad.clone()).unwrap(),
    ];
    let mut vm = frontend(&dir.join("good.sock"));
    exchange(&mut h, &good, &mut vm, 0);
    for (i, role) in [(0usize, "interrupt (call)"), (1, "kick")] {
        let rogue = frontend(&dir.join("bad.sock"));
        let (_read_end, write_end) = pipe_end();
        rogue.fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        let r = if i == 0 {
            rogue.fe.set_vring_call(0, &write_end)
        } else {
            rogue.fe.set_vring_kick(1, &write_end)
        };
        assert!(r.is_err(), "the frontend is told (REPLY_ACK)");
        let why = bad.ring_error().expect("the port is in error");
        assert!(
            why.contains(&format!(
                "the {role} descriptor is refused: it is a pipe, not an eventfd"
            )),
            "{why}"
        );
        assert!(!bad.link_up());
        exchange(&mut h, &good, &mut vm, 1 + i);
        drop(rogue);
        wait_for("the bad frontend to go", || bad.ring_error().is_some() && !bad.link_up());
    }
    let mut again = frontend(&dir.join("bad.sock"));
    exchange(&mut h, &bad, &mut again, 9);
    assert_eq!(bad.ring_error(), None, "a new connection clears the error");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The frontend fills its interrupt eventfd's counter and clears `O_NONBLOCK` on it (the flag
/// is the shared open file's): the switch's next interrupt would wait for ever, and the PMD
/// thread with it. It is cut off within the watchdog's limit instead; the port is in error
/// and the bystander forwards.
#[test]
fn an_interrupt_descriptor_made_to_block_cannot_hold_the_switch() {
    let dir = scratch("hostile-call");
    let (mut h, ports) = bridged(&["good", "bad"]);
    let (good, bad) = (ports[0].clone(), ports[1].clone());
    let _servers = [
        serve(&dir.join("good.sock"), good.clone()).unwrap(),
        serve(&dir.join("bad.sock"), bad.clone()).unwrap(),
    ];
    let mut vm = frontend(&dir.join("good.sock"));
    let mut rogue = frontend(&dir.join("bad.sock"));
    exchange(&mut h, &bad, &mut rogue, 0);
    let call = rogue.events[0].as_raw_fd(); // the receive ring's interrupt
    let max = (u64::MAX - 1).to_ne_bytes();
    // SAFETY: an 8-byte write to our eventfd, then fcntl on it.
    unsafe {
        libc::read(call, [0u8; 8].as_mut_ptr().cast(), 8);
        assert_eq!(libc::write(call, max.as_ptr().cast(), 8), 8);
        let flags = libc::fcntl(call, libc::F_GETFL);
        libc::fcntl(call, libc::F_SETFL, flags & !libc::O_NONBLOCK);
    }
    rogue.rx.post(&[Buf::Write(2048)]);
    rogue.rx.set_used_event(1); // an interrupt for the next completion (EVENT_IDX)
    let ip = |n| std::net::Ipv4Addr::new(192, 0, 2, n);
    h.send(
        "r0",
        &frames::udp4(vswitch::wire::MacAddr::BROADCAST, mac(9), ip(9), ip(255), 1, 2, 100),
    );
    let t = Instant::now();
    h.step();
    assert!(t.elapsed() < Duration::from_secs(1), "the step took {:?}", t.elapsed());
    let why = bad.ring_error().expect("the port is in error");
    assert!(why.contains("interrupt (call) descriptor made the switch wait"), "{why}");
    assert!(!bad.link_up());
    for round in 1..4 {
        exchange(&mut h, &good, &mut vm, round);
    }
    drop(rogue);
    // Reconnecting to stall the switch again gets nothing: the port no longer signals (or
    // reads) its frontends' eventfds, and a frontend that behaves works polled.
    assert!(bad.distrusted());
    let mut again = frontend(&dir.join("bad.sock"));
    exchange(&mut h, &bad, &mut again, 9);
    let call = again.events[0].as_raw_fd();
    // SAFETY: fcntl and a read of 8 bytes on our eventfd.
    unsafe {
        let flags = libc::fcntl(call, libc::F_GETFL);
        libc::fcntl(call, libc::F_SETFL, flags & !libc::O_NONBLOCK);
    }
    again.rx.post(&[Buf::Write(2048)]);
    again.rx.set_used_event(1);
    h.send(
        "r0",
        &frames::udp4(vswitch::wire::MacAddr::BROADCAST, mac(9), ip(9), ip(255), 1, 2, 100),
    );
    let t = Instant::now();
    h.step();
    assert!(t.elapsed() < Duration::from_millis(40), "a second stall: {:?}", t.elapsed());
    assert_eq!(again.rx.completions().len(), 1, "the frame went in, polled");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A frontend that sends part of a message and stops is cut off after the message deadline
/// (its port says so), and a server stopped while it waits stops at once: before, the
/// connection thread read the rest for ever, and deleting the port — under the node's lock —
/// waited for that thread.
#[test]
fn a_frontend_stopping_mid_message_is_cut_off_and_never_holds_a_stop() {
    use std::io::Write;
    let dir = scratch("hostile-msg");
    let (mut h, ports) = bridged(&["good", "bad"]);
    let (good, bad) = (ports[0].clone(), ports[1].clone());
    let _good_server = serve(&dir.join("good.sock"), good.clone()).unwrap();
    let bad_server = serve(&dir.join("bad.sock"), bad.clone()).unwrap();
    let mut vm = frontend(&dir.join("good.sock"));
    // Six bytes of a twelve-byte header.
    let mut s = std::os::unix::net::UnixStream::connect(dir.join("bad.sock")).unwrap();
    s.write_all(&[1, 0, 0, 0, 1, 0]).unwrap();
    exchange(&mut h, &good, &mut vm, 0);
    wait_for("the frontend to be cut off", || bad.ring_error().is_some());
    let why = bad.ring_error().unwrap();
    assert!(why.contains("sent 6 bytes of a message and nothing more"), "{why}");
    // Again, and this time the port goes while the thread waits.
    let mut s2 = std::os::unix::net::UnixStream::connect(dir.join("bad.sock")).unwrap();
    s2.write_all(&[1, 0, 0, 0]).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    drop(bad_server);
    assert!(t.elapsed() < Duration::from_millis(500), "stopping the server took {:?}", t.elapsed());
    exchange(&mut h, &good, &mut vm, 1);
    drop((s, s2));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Memory tables the switch will not map: more regions than the specification's eight, more
/// memory than the node allows a frontend, a file that is not shared memory (its pages would
/// be read from disk by the PMD thread).
#[test]
fn memory_tables_beyond_the_limits_are_refused() {
    let dir = scratch("hostile-mem");
    let (mut h, ports) = bridged(&["good", "bad"]);
    let (good, bad) = (ports[0].clone(), ports[1].clone());
    let _servers = [
        serve(&dir.join("good.sock"), good.clone()).unwrap(),
        serve(&dir.join("bad.sock"), bad.clone()).unwrap(),
    ];
    let mut vm = frontend(&dir.join("good.sock"));
    let start = |files: &[OwnedFd], size: u64| {
        let mut fe = Frontend::connect(dir.join("bad.sock"), 2).unwrap();
        fe.set_owner().unwrap();
        let features = fe.get_features().unwrap();
        fe.set_features(features & !knitter_vhost::backend::VIRTIO_F_RING_PACKED).unwrap(); // drives split rings
        fe.get_protocol_features().unwrap();
        fe.set_protocol_features(VhostUserProtocolFeatures::REPLY_ACK).unwrap();
        fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        let regions: Vec<VhostUserMemoryRegionInfo> = files
            .iter()
            .enumerate()
            .map(|(i, f)| VhostUserMemoryRegionInfo {
                guest_phys_addr: i as u64 * size,
                memory_size: size,
                userspace_addr: 0x7000_0000_0000 + i as u64 * size,
                mmap_offset: 0,
                mmap_handle: f.as_raw_fd(),
            })
            .collect();
        let r = fe.set_mem_table(&regions).map(drop);
        (fe, r)
    };
    let refused = |what: &str, says: &str, fe_r: (Frontend, vhost::Result<()>)| {
        assert!(fe_r.1.is_err(), "{what}: the frontend is told");
        let why = bad.ring_error().unwrap_or_default();
        assert!(why.contains("memory table refused") && why.contains(says), "{what}: {why}");
        drop(fe_r.0);
        wait_for("the frontend to go", || !bad.link_up());
    };
    let nine: Vec<OwnedFd> = (0..9).map(|_| memfd(4096)).collect();
    refused("nine regions", "9 regions; at most 8", start(&nine, 4096));
    exchange(&mut h, &good, &mut vm, 0);
    // A sparse memfd of 1 TiB: nothing in it is memory yet, and the guest's descriptors
    // would make the switch allocate whatever pages they name.
    let huge = memfd(0);
    // SAFETY: ftruncate on the test's own descriptor.
    assert_eq!(unsafe { libc::ftruncate(huge.as_raw_fd(), 1 << 40) }, 0);
    let limit = format!(
        "this node maps at most {} a frontend",
        knitter_vhost::backend::DEFAULT_MAX_GUEST_MEMORY
    );
    refused("1 TiB", &limit, start(&[huge], 1 << 40));
    // A small region a terabyte into the file: the offset is no way around the limit (only
    // the region's pages are mapped).
    let far = memfd(0);
    // SAFETY: ftruncate on the test's own descriptor.
    assert_eq!(unsafe { libc::ftruncate(far.as_raw_fd(), (1 << 40) + MEM_LEN as i64) }, 0);
    let mut fe = Frontend::connect(dir.join("bad.sock"), 2).unwrap();
    fe.set_owner().unwrap();
    let features = fe.get_features().unwrap();
    fe.set_features(features & !knitter_vhost::backend::VIRTIO_F_RING_PACKED).unwrap(); // drives split rings
    fe.get_protocol_features().unwrap();
    fe.set_protocol_features(VhostUserProtocolFeatures::REPLY_ACK).unwrap();
    fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
    let region = VhostUserMemoryRegionInfo {
        guest_phys_addr: 0,
        memory_size: MEM_LEN as u64,
        userspace_addr: 0x7000_0000_0000,
        mmap_offset: 1 << 40,
        mmap_handle: far.as_raw_fd(),
    };
    fe.set_mem_table(&[region]).unwrap();
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let vm_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    assert!(vm_kib < 1 << 30, "the switch mapped {vm_kib} KiB: more than the region");
    drop(fe);
    wait_for("the frontend to go", || !bad.link_up());
    exchange(&mut h, &good, &mut vm, 1);
    // A file on a disk (the build directory's file system), unless that is a tmpfs.
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("guest-{}", std::process::id()));
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(MEM_LEN as u64).unwrap();
    let _ = std::fs::remove_file(&path);
    // SAFETY: statfs into our zeroed buffer.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above, of our own file.
    assert_eq!(unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) }, 0);
    if st.f_type != libc::TMPFS_MAGIC {
        refused(
            "a file on a disk",
            "must be shared memory",
            start(&[OwnedFd::from(file)], MEM_LEN as u64),
        );
    }
    exchange(&mut h, &good, &mut vm, 2);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `HugePages_Free`, from /proc/meminfo.
fn free_huge_pages() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("HugePages_Free:").map(|v| v.trim().parse().unwrap_or(0)))
        .unwrap_or(0)
}

/// A VNF's memory on huge pages (what DPDK uses), announced with a size that is not a whole
/// number of huge pages, and truncated under the switch: the switch recovers from the SIGBUS
/// (before, the mapping's length was not rounded to the huge page size, so the recovery's
/// remap failed and the switch died, and unmapping it failed and leaked its huge pages), the
/// port is in error, the bystander forwards, and every huge page is free again once the port
/// is gone. Needs two free 2 MiB huge pages (reserved for the test when it runs as root);
/// `serial_`: it changes the machine's huge page count.
#[test]
fn serial_a_hugetlbfs_frontend_that_truncates_its_memory_leaks_nothing() {
    const NR: &str = "/proc/sys/vm/nr_hugepages";
    let before_nr: u64 =
        std::fs::read_to_string(NR).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(0);
    let reserve = free_huge_pages() < 2;
    if reserve {
        let _ = std::fs::write(NR, format!("{}", before_nr + 2));
    }
    let restore = || {
        if reserve {
            let _ = std::fs::write(NR, format!("{before_nr}"));
        }
    };
    if free_huge_pages() < 2 {
        restore();
        eprintln!("skipped: no two free huge pages (vm.nr_hugepages)");
        assert!(std::env::var_os("CI").is_none(), "CI runs as root and can reserve huge pages");
        return;
    }
    let free_before = free_huge_pages();
    {
        let dir = scratch("hostile-huge");
        let (mut h, ports) = bridged(&["good", "bad"]);
        let (good, bad) = (ports[0].clone(), ports[1].clone());
        let _servers = [
            serve(&dir.join("good.sock"), good.clone()).unwrap(),
            serve(&dir.join("bad.sock"), bad.clone()).unwrap(),
        ];
        let mut vm = frontend(&dir.join("good.sock"));
        // SAFETY: memfd_create with a static name; checked and owned below.
        let fd = unsafe {
            libc::memfd_create(c"knitter-huge".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_HUGETLB)
        };
        assert!(fd >= 0, "memfd_create(MFD_HUGETLB): {}", std::io::Error::last_os_error());
        // SAFETY: a fresh descriptor; ftruncate to two huge pages.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ftruncate on our own descriptor.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), MEM_LEN as i64) }, 0);
        let fe = Frontend::connect(dir.join("bad.sock"), 2).unwrap();
        let mut rogue = set_up_on(fe, fd, MEM_LEN - 4096, 1, |_| {});
        exchange(&mut h, &bad, &mut rogue, 0);
        // SAFETY: ftruncate on the test's own descriptor: the huge pages go.
        assert_eq!(unsafe { libc::ftruncate(rogue.memfd.as_raw_fd(), 0) }, 0);
        for round in 1..4 {
            exchange(&mut h, &good, &mut vm, round);
        }
        wait_for("the switch to see the fault", || {
            h.step();
            bad.net.memory_faults.get() > 0
        });
        assert!(bad.ring_error().unwrap_or_default().contains("memory file shrank"));
        drop(rogue);
        wait_for("the bad port to stop", || !bad.link_up());
        exchange(&mut h, &good, &mut vm, 9);
        drop((vm, _servers));
        h.flush_caches();
        let _ = std::fs::remove_dir_all(&dir);
    }
    let ok =
        vswitch::testkit::eventually(Duration::from_secs(5), || free_huge_pages() == free_before);
    let free_after = free_huge_pages();
    restore();
    assert!(ok, "huge pages free before {free_before}, after {free_after}");
}

/// Every ring size the virtio spec allows a split ring is taken (up to 32,768 entries, as
/// DPDK's vhost library and OVS take); one it does not (not a power of two) is refused where
/// the user looks: the frontend is told and the port says why, not only the daemon's log.
#[test]
fn a_ring_size_is_taken_up_to_the_specs_limit_and_a_refused_one_is_shown() {
    let dir = scratch("hostile-ring-size");
    let (mut h, ports) = bridged(&["good", "bad"]);
    let (good, bad) = (ports[0].clone(), ports[1].clone());
    let _servers = [
        serve(&dir.join("good.sock"), good.clone()).unwrap(),
        serve(&dir.join("bad.sock"), bad.clone()).unwrap(),
    ];
    let mut vm = frontend(&dir.join("good.sock"));
    for size in [2048, 4096, 32768] {
        let fe = frontend(&dir.join("bad.sock"));
        fe.fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        assert!(fe.fe.set_vring_num(0, size).is_ok(), "{size} entries taken");
        assert_eq!(bad.ring_error(), None);
        drop(fe);
        wait_for("the frontend to go", || !bad.link_up());
    }
    let rogue = frontend(&dir.join("bad.sock"));
    rogue.fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
    assert!(rogue.fe.set_vring_num(0, 3000).is_err(), "the frontend is told (REPLY_ACK)");
    let why = bad.ring_error().expect("the port is in error");
    assert!(why.contains("ring 0: 3000 entries refused (a power of two up to 32768)"), "{why}");
    exchange(&mut h, &good, &mut vm, 0);
    drop(rogue);
    let _ = std::fs::remove_dir_all(&dir);
}
