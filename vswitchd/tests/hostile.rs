//! One daemon, many tenants: hostile vhost-user frontends attack the node through what a pod
//! controls — descriptors that are not eventfds or are made to block, half a message, rings
//! of empty descriptors, a memory file truncated or a terabyte large, a symlink where its
//! socket should be — while a bystander pair of ports forwards between two well-behaved
//! guests and the node API answers. Each attack breaks only the attacker's port, which says
//! why. Runs in the `serial` nextest group (the daemon starts a PMD thread).

mod common;
#[path = "../../ports/vhost/tests/common/frontend.rs"]
mod frontend;

use common::{Daemon, add_bridge, add_port, bridge, vhost_port};
use frontend::{Vm, frontend, memfd};
use knitter_api::node as pb;
use knitter_vhost::net::HDR_LEN;
use knitter_vhost::testkit::{BUFS_AT, Buf};
use knitter_vhost::vring::{VIRTQ_DESC_F_INDIRECT, VIRTQ_DESC_F_NEXT};
use pb::node_client::NodeClient;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use vhost::vhost_user::message::{VhostUserHeaderFlag, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo};
use vmm_sys_util::eventfd::EventFd;
use vswitch::testkit::{frames, mac};

/// The longest the node API may take to answer while a frontend attacks.
const API_DEADLINE: Duration = Duration::from_secs(2);

/// Two well-behaved guests on ports "a" and "b": each round, "a" broadcasts a frame (which
/// the switch floods to "b" and to the attacker's port) and "b" must receive it.
struct Bystanders {
    a: Vm,
    b: Vm,
    round: usize,
}

impl Bystanders {
    fn forward(&mut self, during: &str) {
        self.round += 1;
        let ip = |n| std::net::Ipv4Addr::new(192, 0, 2, n);
        let f = frames::udp4(
            vswitch::wire::MacAddr::BROADCAST,
            mac(0xa),
            ip(10),
            ip(255),
            1,
            2,
            100 + self.round,
        );
        let at = self.b.rx.post(&[Buf::Write(2048)]).1[0];
        let mut b = vec![0u8; HDR_LEN];
        b.extend_from_slice(&f);
        self.a.tx.post(&[Buf::Read(b)]);
        self.a.events[3].write(1).unwrap(); // the transmit ring's kick, for a PMD thread asleep
        let until = Instant::now() + Duration::from_secs(2);
        while self.b.rx.completions().is_empty() {
            assert!(Instant::now() < until, "the bystanders stopped forwarding {during}");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(self.b.rx.read(at + HDR_LEN as u64, f.len()), f, "{during}");
        let _ = self.a.tx.completions();
    }
}

/// The node's view, asked with a deadline.
async fn show(c: &mut NodeClient<Channel>, during: &str) -> pb::NodeView {
    let t = Instant::now();
    let v = tokio::time::timeout(API_DEADLINE, c.show(pb::ShowRequest {})).await;
    let v = v
        .unwrap_or_else(|_| panic!("the node API did not answer in {API_DEADLINE:?} {during}"))
        .unwrap()
        .into_inner();
    assert!(t.elapsed() < API_DEADLINE, "{during}");
    v
}

/// Port `name`'s status.
fn status(v: &pb::NodeView, name: &str) -> pb::PortStatus {
    v.status.iter().find(|s| s.name == name).cloned().unwrap_or_default()
}

/// Waits (bounded) until port `name` says `says` in its error.
async fn error_says(c: &mut NodeClient<Channel>, name: &str, says: &str) -> pb::PortStatus {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let s = status(&show(c, says).await, name);
        if s.ring_error.contains(says) || s.error.contains(says) {
            return s;
        }
        assert!(Instant::now() < until, "port {name} never said {says:?}: {s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn connected(c: &mut NodeClient<Channel>, name: &str) {
    let until = Instant::now() + Duration::from_secs(10);
    while status(&show(c, "connecting").await, name).vhost_connected != Some(true) {
        assert!(Instant::now() < until, "{name} never connected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn pipe_end() -> (OwnedFd, EventFd) {
    let mut p = [0; 2];
    // SAFETY: pipe fills our two-element array.
    assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
    // SAFETY: fresh descriptors, each owned once.
    unsafe { (OwnedFd::from_raw_fd(p[0]), EventFd::from_raw_fd(p[1])) }
}

/// A frontend that negotiates and then sends a memory table of `files`, `size` bytes each.
fn memory_table(sock: &Path, files: &[OwnedFd], size: u64) -> Frontend {
    let mut fe = Frontend::connect(sock, 2).unwrap();
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
    assert!(fe.set_mem_table(&regions).is_err(), "the frontend is told");
    fe
}

#[tokio::test]
async fn hostile_frontends_break_only_their_port_and_the_node_answers() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &["--no-state"]).await;
    let mut c = d.client();
    add_bridge(&mut c, bridge("red")).await.unwrap();
    for name in ["a", "b", "x"] {
        add_port(&mut c, vhost_port(dir.path(), name, "red")).await.unwrap();
    }
    let sock = |n: &str| dir.path().join(format!("{n}.sock"));
    let mut by = Bystanders { a: frontend(&sock("a")), b: frontend(&sock("b")), round: 0 };
    connected(&mut c, "a").await;
    connected(&mut c, "b").await;
    by.forward("before any attack");

    // 1. A pipe as the interrupt descriptor (it would fill and block the PMD thread).
    {
        let rogue = frontend(&sock("x"));
        let (_r, w) = pipe_end();
        rogue.fe.set_vring_call(0, &w).unwrap();
        error_says(
            &mut c,
            "x",
            "the interrupt (call) descriptor is refused: it is a pipe, not an eventfd",
        )
        .await;
        by.forward("beside a pipe as an interrupt descriptor");
    }

    // 2. The interrupt eventfd filled and made blocking again behind the switch's back.
    {
        let mut rogue = frontend(&sock("x"));
        connected(&mut c, "x").await;
        for _ in 0..8 {
            rogue.rx.post(&[Buf::Write(2048)]);
        }
        rogue.rx.set_used_event(0);
        let call = rogue.events[0].as_raw_fd();
        let max = (u64::MAX - 1).to_ne_bytes();
        // SAFETY: reads and writes of 8 bytes on our eventfd, then fcntl on it.
        unsafe {
            libc::read(call, [0u8; 8].as_mut_ptr().cast(), 8);
            assert_eq!(libc::write(call, max.as_ptr().cast(), 8), 8);
            let flags = libc::fcntl(call, libc::F_GETFL);
            libc::fcntl(call, libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
        by.forward("while the attacker's interrupt blocks"); // the broadcast reaches "x" too
        let s = error_says(&mut c, "x", "interrupt (call) descriptor made the switch wait").await;
        assert!(!s.link_up);
        by.forward("after the attacker's interrupt blocked");
    }

    // 3. Half a message, then the port deleted and added again: neither waits on it.
    {
        use std::io::Write;
        let mut s = std::os::unix::net::UnixStream::connect(sock("x")).unwrap();
        s.write_all(&[1, 0, 0, 0]).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        show(&mut c, "while a frontend holds half a message").await;
        let t = Instant::now();
        c.delete_port(pb::DeleteRequest { name: "x".into(), ..Default::default() }).await.unwrap();
        add_port(&mut c, vhost_port(dir.path(), "x", "red")).await.unwrap();
        assert!(t.elapsed() < API_DEADLINE, "deleting and adding the port took {:?}", t.elapsed());
        by.forward("after the half-message frontend's port went");
        assert!(s.write_all(&[1, 0, 0, 0]).is_err(), "the old connection was shut down");
        // Left waiting, a frontend with half a message is cut off.
        let mut s = std::os::unix::net::UnixStream::connect(sock("x")).unwrap();
        s.write_all(&[1, 0, 0, 0]).unwrap();
        error_says(&mut c, "x", "bytes of a message and nothing more").await;
    }

    // 4. Rings of chains of empty descriptors (64 direct, then 4,096 indirect), a ring full.
    {
        let mut rogue = frontend(&sock("x"));
        connected(&mut c, "x").await;
        let table = BUFS_AT + 0x8_0000;
        for i in 0..63 {
            rogue.tx.put_desc(i, BUFS_AT, 0, VIRTQ_DESC_F_NEXT, i + 1);
        }
        rogue.tx.put_desc(63, table, 16 * 4096, VIRTQ_DESC_F_INDIRECT, 0);
        let mut t = vec![0u8; 16 * 4096];
        for (i, e) in t.chunks_mut(16).enumerate() {
            e[12..14].copy_from_slice(&VIRTQ_DESC_F_NEXT.to_le_bytes());
            e[14..].copy_from_slice(&((i as u16 + 1) % 4096).to_le_bytes());
        }
        rogue.tx.write(table, &t);
        for _ in 0..64 {
            rogue.tx.make_available(0);
        }
        rogue.events[3].write(1).unwrap();
        let until = Instant::now() + Duration::from_secs(5);
        while status(&show(&mut c, "empty chains").await, "x")
            .vhost_errors
            .map_or(0, |e| e.bad_chains)
            < 64
        {
            assert!(Instant::now() < until, "the chains were not refused");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        by.forward("beside rings of empty chains");
    }

    // 5. The memory file truncated while the switch uses it.
    {
        let rogue = frontend(&sock("x"));
        connected(&mut c, "x").await;
        // SAFETY: ftruncate on the test's own descriptor.
        assert_eq!(unsafe { libc::ftruncate(rogue.memfd.as_raw_fd(), 0) }, 0);
        for _ in 0..3 {
            by.forward("beside a truncated memory file"); // each broadcast touches x's rings
        }
        error_says(&mut c, "x", "memory file shrank").await;
        // Its own mapping reads zeroes now (the test's SIGBUS guard), so drop it quietly.
        drop(rogue);
    }

    // 6. A memory table of a terabyte (a sparse memfd).
    {
        let huge = memfd(0);
        // SAFETY: ftruncate on the test's own descriptor.
        assert_eq!(unsafe { libc::ftruncate(huge.as_raw_fd(), 1 << 40) }, 0);
        let _fe = memory_table(&sock("x"), &[huge], 1 << 40);
        error_says(&mut c, "x", "this node maps at most").await;
        by.forward("beside a terabyte memory table");
    }

    // 7. A symlink where a client-mode port's socket should be, to another VNF's socket: the
    // switch must not connect to that VNF as this port.
    {
        let victim_dir = dir.path().join("victim");
        let pod_dir = dir.path().join("pod");
        std::fs::create_dir_all(&victim_dir).unwrap();
        std::fs::create_dir_all(&pod_dir).unwrap();
        let victim = std::os::unix::net::UnixListener::bind(victim_dir.join("net1.sock")).unwrap();
        victim.set_nonblocking(true).unwrap();
        std::os::unix::fs::symlink(victim_dir.join("net1.sock"), pod_dir.join("net1.sock"))
            .unwrap();
        let mut y = vhost_port(&pod_dir, "y", "red");
        if let Some(pb::device::Kind::VhostUser(v)) =
            y.device.as_mut().and_then(|d| d.kind.as_mut())
        {
            (v.socket, v.client) = (pod_dir.join("net1.sock").display().to_string(), true);
        }
        add_port(&mut c, y).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(
            victim.accept().is_err(),
            "the switch connected through the symlink to another VNF"
        );
        assert_eq!(status(&show(&mut c, "symlink").await, "y").vhost_connected, Some(false));
        by.forward("beside a planted symlink");
    }

    // The attacker's port works again for a frontend that behaves.
    let mut fine = frontend(&sock("x"));
    connected(&mut c, "x").await;
    assert_eq!(
        status(&show(&mut c, "after the attacks").await, "x").ring_error,
        "",
        "a new connection clears the error"
    );
    by.forward("after every attack");
    let _ = fine.rx.completions();
    assert!(d.child.id() > 0);
    drop((fine, by));
}
