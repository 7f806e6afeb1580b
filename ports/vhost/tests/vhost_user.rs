//! The vhost-user protocol end to end: rust-vmm's frontend (as QEMU or DPDK's virtio-user
//! would) connects to the port's socket, shares a memfd as guest memory, sets up both rings
//! and enables them; a simulated guest in that memory then exchanges frames with a ring port
//! through the switch. The frontend goes away and comes back: the port follows.

#[path = "common/bridged.rs"]
mod bridged;
#[path = "common/frontend.rs"]
mod frontend;

use bridged::{bridged, exchange, scratch, wait_for};
use frontend::{frontend, memfd, negotiate, set_up, set_up_pairs, set_up_with};
use knitter_vhost::backend::{connect, serve};
use knitter_vhost::net::HDR_LEN;
use knitter_vhost::port::VhostPort;
use knitter_vhost::testkit::{Buf, MEM_LEN};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;
use vhost::vhost_user::message::{VhostUserHeaderFlag, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vmm_sys_util::eventfd::EventFd;
use vswitch::Pool;
use vswitch::port::Port;
use vswitch::testkit::{frames, mac};

#[test]
fn a_vhost_user_frontend_talks_through_the_switch() {
    let dir = scratch("vu");
    let path = dir.join("vu0.sock");
    let (mut h, ports) = bridged(&["vu0"]);
    let port = ports[0].clone();
    let server = serve(&path, port.clone()).unwrap();
    assert!(!port.link_up(), "no frontend yet");

    for round in 0..2 {
        let mut vm = frontend(&path);
        exchange(&mut h, &port, &mut vm, round);
        // The memory table again while the rings run: they go on where they were (nothing
        // replayed, nothing skipped).
        let region = vm.region;
        vm.fe.set_mem_table(&[region]).unwrap();
        exchange(&mut h, &port, &mut vm, round + 10);
        // The ring layout cannot change under running rings: refused, and they go on.
        vm.fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        assert!(vm.fe.set_features(knitter_vhost::backend::FEATURES).is_err(), "packed rings now");
        vm.fe.set_hdr_flags(VhostUserHeaderFlag::empty());
        exchange(&mut h, &port, &mut vm, round + 20);
        // The frontend goes away: the port stops; the next round reconnects.
        vm.fe.get_vring_base(0).unwrap();
        drop(vm);
        wait_for("the port to stop", || !port.link_up());
    }
    drop(server);
    h.flush_caches();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Client mode: the frontend listens (QEMU `server=on`); the port connects, and connects
/// again after the frontend restarts.
#[test]
fn client_mode_connects_and_reconnects() {
    let dir = scratch("vuc");
    let path = dir.join("vm.sock");
    let (mut h, ports) = bridged(&["vc0"]);
    let port = ports[0].clone();
    // The port starts first and keeps trying until the frontend listens.
    let client = connect(&path, port.clone()).unwrap();
    for round in 0..2 {
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let (stream, _) = listener.accept().unwrap();
        let mut vm = set_up(Frontend::from_stream(stream, 2));
        exchange(&mut h, &port, &mut vm, round);
        drop(vm);
        drop(listener);
        std::fs::remove_file(&path).unwrap();
        wait_for("the port to stop", || !port.link_up());
    }
    drop(client);
    h.flush_caches();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two queue pairs: the guest transmits on either, the port receives from both; with pair
/// 0's receive ring disabled, the port sends only into pair 1's.
#[test]
fn two_queue_pairs() {
    let dir = scratch("vumq");
    let path = dir.join("vu0.sock");
    let (mut h, ports) = bridged(&["vu0"]);
    let port = ports[0].clone();
    let server = serve(&path, port.clone()).unwrap();
    let mut vm = set_up_pairs(Frontend::connect(&path, 4).expect("connect"), 2);
    wait_for("both pairs to run", || port.running_pairs() == 2);
    let ip = |n| std::net::Ipv4Addr::new(192, 0, 2, n);
    let with_header = |f: &[u8]| [vec![0u8; HDR_LEN], f.to_vec()].concat();
    // One frame on each transmit ring.
    let (f0, f1) = (
        frames::udp4(mac(9), mac(1), ip(1), ip(9), 1, 2, 100),
        frames::udp4(mac(9), mac(1), ip(1), ip(9), 1, 3, 100),
    );
    vm.tx.post(&[Buf::Read(with_header(&f0))]);
    vm.more[1].post(&[Buf::Read(with_header(&f1))]);
    h.step();
    let mut got = h.recv("r0");
    got.sort();
    let mut want = vec![f0, f1];
    want.sort();
    assert_eq!(got, want, "both transmit rings polled");
    let stats = port.queue_stats();
    assert_eq!((stats[0].rx_packets, stats[1].rx_packets), (1, 1));
    // The guest stops pair 0's receive ring: frames go to pair 1's.
    vm.fe.set_vring_enable(0, false).unwrap();
    wait_for("pair 0 to stop", || port.running_pairs() == 1);
    let rx0 = vm.rx.post(&[Buf::Write(2048)]).1[0];
    let rx1 = vm.more[0].post(&[Buf::Write(2048)]).1[0];
    let back = frames::udp4(mac(1), mac(9), ip(9), ip(1), 2, 1, 200);
    h.send("r0", &back);
    h.step();
    assert!(vm.rx.completions().is_empty(), "nothing into a disabled ring");
    assert_eq!(vm.more[0].completions().len(), 1);
    assert_eq!(vm.more[0].read(rx1 + HDR_LEN as u64, back.len()), back);
    // Enabled again: pair 0 (the switch's one PMD thread sends on tx queue 0).
    vm.fe.set_vring_enable(0, true).unwrap();
    wait_for("pair 0 to run", || port.running_pairs() == 2);
    h.send("r0", &back);
    h.step();
    assert_eq!(vm.rx.completions().len(), 1);
    assert_eq!(vm.rx.read(rx0 + HDR_LEN as u64, back.len()), back);
    drop(vm);
    wait_for("the port to stop", || !port.link_up());
    drop(server);
    h.flush_caches();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The switch restarts under a frontend that stays (client mode; DPDK's virtio-user then
/// sets every ring up again from base 0): the new port resumes each ring from the used
/// index in guest memory, so frames the guest posts next are the ones that go, and nothing
/// completed before is replayed.
#[test]
fn a_restarted_switch_resumes_from_the_used_index() {
    let dir = scratch("vur");
    let path = dir.join("vm.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let switch = |name: &str| {
        let (h, ports) = bridged(&[name]);
        let client = connect(&path, ports[0].clone()).unwrap();
        (h, ports[0].clone(), client)
    };
    let (mut h, port, client) = switch("before");
    let (stream, _) = listener.accept().unwrap();
    let mut vm = set_up(Frontend::from_stream(stream, 2));
    for round in 0..3 {
        exchange(&mut h, &port, &mut vm, round);
    }
    // The switch goes away (its connection closes) and a new one starts.
    drop(client);
    h.flush_caches();
    drop(h);
    let (mut h, port, client) = switch("after");
    let (stream, _) = listener.accept().unwrap();
    vm.fe = Frontend::from_stream(stream, 2);
    let region = vm.region;
    vm.events = negotiate(&mut vm.fe, &region, &[&vm.rx, &vm.tx], || {});
    for round in 3..5 {
        exchange(&mut h, &port, &mut vm, round);
    }
    drop(vm);
    wait_for("the port to stop", || !port.link_up());
    drop(client);
    h.flush_caches();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A frontend that breaks the rules harms only its own port: a memory table whose region
/// runs past its file is refused (the switch would die of SIGBUS touching it), and a
/// driver that claims more than a queue's worth stops its ring (counted once); meanwhile
/// another port forwards, and the bad port works again once its frontend reconnects.
#[test]
fn a_bad_frontend_harms_only_its_port() {
    let dir = scratch("vub");
    let (mut h, ports) = bridged(&["good", "bad"]);
    let (good, bad) = (ports[0].clone(), ports[1].clone());
    let servers = [
        serve(&dir.join("good.sock"), good.clone()).unwrap(),
        serve(&dir.join("bad.sock"), bad.clone()).unwrap(),
    ];
    let mut vm = frontend(&dir.join("good.sock"));
    exchange(&mut h, &good, &mut vm, 0);

    // A region of MEM_LEN bytes in a file of half that.
    let mut fe = Frontend::connect(dir.join("bad.sock"), 2).unwrap();
    fe.set_owner().unwrap();
    let features = fe.get_features().unwrap();
    fe.set_features(features & !knitter_vhost::backend::VIRTIO_F_RING_PACKED).unwrap(); // drives split rings
    fe.get_protocol_features().unwrap();
    fe.set_protocol_features(VhostUserProtocolFeatures::REPLY_ACK).unwrap();
    let short = memfd(MEM_LEN / 2);
    let region = VhostUserMemoryRegionInfo {
        guest_phys_addr: 0,
        memory_size: MEM_LEN as u64,
        userspace_addr: 0x7000_0000_0000,
        mmap_offset: 0,
        mmap_handle: short.as_raw_fd(),
    };
    let _ = fe.set_mem_table(&[region]); // refused (answered only where the frontend waits)
    // Rings in the half with no file behind it: touching them would raise SIGBUS.
    let far = region.userspace_addr + MEM_LEN as u64 * 3 / 4;
    let mut events = Vec::new();
    for i in 0..2 {
        fe.set_vring_num(i, 64).unwrap();
        let cfg = VringConfigData {
            queue_max_size: 64,
            queue_size: 64,
            flags: 0,
            desc_table_addr: far + i as u64 * 0x4000,
            used_ring_addr: far + i as u64 * 0x4000 + 0x2000,
            avail_ring_addr: far + i as u64 * 0x4000 + 0x1000,
            log_addr: None,
        };
        let _ = fe.set_vring_addr(i, &cfg);
        let kick = EventFd::new(0).unwrap();
        let _ = fe.set_vring_kick(i, &kick);
        let _ = fe.set_vring_enable(i, true);
        events.push(kick);
    }
    std::thread::sleep(Duration::from_millis(50));
    h.step();
    assert!(!bad.link_up(), "no memory, no rings");
    exchange(&mut h, &good, &mut vm, 1);
    drop((fe, events));

    // A driver that claims 500 chains in a queue of 64.
    let rogue = frontend(&dir.join("bad.sock"));
    wait_for("the bad port's rings", || bad.link_up());
    rogue.tx.write(rogue.tx.avail + 2, &500u16.to_le_bytes());
    for round in 2..5 {
        exchange(&mut h, &good, &mut vm, round);
    }
    assert_eq!(bad.net.broken_rings.get(), 1, "the broken ring is counted once");
    assert_eq!(
        bad.ring_error().as_deref(),
        Some("virtqueue 1: the guest made more than a queue's worth of chains available")
    );
    assert_eq!(bad.queue_stats()[0].rx_packets, 0);
    drop(rogue);
    wait_for("the bad port to stop", || !bad.link_up());

    // Reconnected, it works again.
    let mut again = frontend(&dir.join("bad.sock"));
    exchange(&mut h, &bad, &mut again, 9);
    drop((again, vm, servers));
    h.flush_caches();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A frontend that truncates its memory file takes down only its own port, whether it
/// truncates while the switch polls its rings or between SET_MEM_TABLE and its first kick:
/// the switch recovers from the SIGBUS (the mapping becomes zeroes), stops that port's
/// rings and counts it; the other port forwards throughout, and the bad one works again once
/// its frontend reconnects with a new memory table.
#[test]
fn a_frontend_truncating_its_memory_takes_down_only_its_port() {
    let dir = scratch("vut");
    let (mut h, ports) = bridged(&["good", "bad"]);
    let (good, bad) = (ports[0].clone(), ports[1].clone());
    let servers = [
        serve(&dir.join("good.sock"), good.clone()).unwrap(),
        serve(&dir.join("bad.sock"), bad.clone()).unwrap(),
    ];
    let mut vm = frontend(&dir.join("good.sock"));
    exchange(&mut h, &good, &mut vm, 0);

    // While the switch polls.
    let mut rogue = frontend(&dir.join("bad.sock"));
    exchange(&mut h, &bad, &mut rogue, 1);
    // SAFETY: ftruncate on the test's own descriptor.
    assert_eq!(unsafe { libc::ftruncate(rogue.memfd.as_raw_fd(), 0) }, 0);
    for round in 2..5 {
        exchange(&mut h, &good, &mut vm, round);
    }
    // A broadcast reaches the bad port's receive ring too.
    h.send(
        "r0",
        &frames::udp4(
            vswitch::wire::MacAddr::BROADCAST,
            mac(9),
            [192, 0, 2, 9].into(),
            [192, 0, 2, 255].into(),
            1,
            2,
            64,
        ),
    );
    h.step();
    assert_eq!(vm.rx.completions().len(), 0, "the good guest gave no receive buffer this time");
    assert_eq!(bad.net.memory_faults.get(), 2, "both of the bad port's rings stopped");
    let why = bad.ring_error().expect("the port is in error");
    assert!(why.contains("memory file shrank"), "{why}");
    assert_eq!(good.ring_error(), None);
    drop(rogue);
    wait_for("the bad port to stop", || !bad.link_up());

    // Between SET_MEM_TABLE and the first kick.
    let fe = Frontend::connect(dir.join("bad.sock"), 2).unwrap();
    let late = set_up_with(fe, 1, |memfd| {
        // SAFETY: ftruncate on the test's own descriptor.
        assert_eq!(unsafe { libc::ftruncate(memfd.as_raw_fd(), 0) }, 0);
    });
    wait_for("the new table's rings to stop", || {
        h.step();
        bad.net.memory_faults.get() >= 3
    });
    for round in 5..8 {
        exchange(&mut h, &good, &mut vm, round);
    }
    assert_eq!(bad.queue_stats()[0].rx_packets, 1, "nothing more from the bad port");
    drop(late);
    wait_for("the bad port to stop", || !bad.link_up());

    // Reconnected with a whole file, it works again.
    let mut again = frontend(&dir.join("bad.sock"));
    exchange(&mut h, &bad, &mut again, 9);
    assert_eq!(bad.ring_error(), None, "a new connection clears the error");
    drop((again, vm, servers));
    h.flush_caches();
    let _ = std::fs::remove_dir_all(&dir);
}

/// NET_SET_MTU and SEND_RARP (which rust-vmm's handler does not know): the MTU is recorded
/// (and refused above the port's longest frame), and a RARP frame from the announced MAC
/// goes into the bridge domain, as QEMU asks after migrating a guest; the connection goes
/// on.
#[test]
fn mtu_and_rarp() {
    use std::io::{Read, Write};
    let dir = scratch("vum");
    let path = dir.join("vu0.sock");
    let (mut h, ports) = bridged(&["vu0"]);
    let port = ports[0].clone();
    let server = serve(&path, port.clone()).unwrap();
    let stream = std::os::unix::net::UnixStream::connect(&path).unwrap();
    let mut raw = stream.try_clone().unwrap();
    let mut vm = set_up(Frontend::from_stream(stream, 2));
    exchange(&mut h, &port, &mut vm, 0);
    // request, flags (version 1, reply wanted), size 8, then the u64; the answer's u64 is 0
    // for success.
    let mut ask = |request: u32, value: u64| {
        let mut m = Vec::new();
        for w in [request, 0x1 | 0x8, 8] {
            m.extend_from_slice(&w.to_le_bytes());
        }
        m.extend_from_slice(&value.to_le_bytes());
        raw.write_all(&m).unwrap();
        let mut reply = [0u8; 20];
        raw.read_exact(&mut reply).unwrap();
        assert_eq!(u32::from_le_bytes(reply[..4].try_into().unwrap()), request);
        u64::from_le_bytes(reply[12..].try_into().unwrap())
    };
    assert_eq!(ask(20, 1500), 0, "NET_SET_MTU 1500");
    assert_ne!(ask(20, 20_000), 0, "NET_SET_MTU above the longest frame");
    assert_eq!(port.guest_mtu(), Some(1500));
    let guest = mac(0x42);
    let mut announced = [0u8; 8];
    announced[..6].copy_from_slice(&guest.0);
    assert_eq!(ask(19, u64::from_le_bytes(announced)), 0, "SEND_RARP");
    h.step();
    assert_eq!(h.recv("r0"), vec![knitter_vhost::port::rarp_frame(guest).to_vec()]);
    exchange(&mut h, &port, &mut vm, 1);
    drop(vm);
    drop(server);
    h.flush_caches();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A server socket gets the mode and group asked for; a path longer than a unix socket
/// address holds is refused with the reason, in both modes.
#[test]
fn socket_permissions_and_path_length() {
    use knitter_vhost::backend::{MAX_SOCKET_PATH, SocketPerms, serve_with};
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = std::env::temp_dir().join(format!("knitter-vup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pool = Pool::new(1024, false).unwrap();
    let port = Arc::new(VhostPort::new("vu0", pool));
    let path = dir.join("vu0.sock");
    let server = serve_with(
        &path,
        port.clone(),
        SocketPerms { mode: Some(0o660), owner: None, group: Some(100) },
    )
    .unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    assert_eq!(meta.gid(), 100);
    drop(server);
    // A path longer than a socket address holds (a pod's emptyDir under the kubelet's
    // directory): the switch serves it through its directory's descriptor.
    let deep = dir.join("d".repeat(MAX_SOCKET_PATH));
    std::fs::create_dir_all(&deep).unwrap();
    let long = deep.join("vu0.sock");
    let server = serve(&long, port.clone()).unwrap();
    assert!(std::fs::symlink_metadata(&long).is_ok());
    drop(server);
    assert!(std::fs::symlink_metadata(&long).is_err(), "removed when the server stops");
    let _ = std::fs::remove_dir_all(&dir);
}
