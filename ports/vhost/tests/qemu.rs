//! A Linux guest on a vhost-user port: QEMU (TCG: nested KVM does not work here) boots
//! Debian's kernel with a busybox initramfs (`ci/guest.sh` builds both into
//! `target/guest`), its interrupt-driven virtio-net driver with two queue pairs on two
//! vCPUs. The guest pings a pod (a network namespace on an AF_PACKET port of the same
//! bridge domain) and says on its serial console whether each ping came back; it goes down
//! to one queue pair with `ethtool -L eth0 combined 1` (the port follows, and still
//! answers) and back to two (ethtool and its libraries are copied into the image from the
//! host by `ci/guest.sh`; CI installs it); the switch then restarts (client mode: QEMU listens and waits for it) and the pings come back again.
//! Needs `qemu-system-x86_64`, root and iproute2 (fails under CI without them, skips
//! elsewhere); runs in the `serial` nextest group.

use kernel_ports::afpacket::AfPacketPort;
use knitter_vhost::backend::connect;
use knitter_vhost::port::VhostPort;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vswitch::port::Port;
use vswitch::testkit;
use vswitch::testkit::netns::{self, Netns};
use vswitch::{PmdConfig, PmdSet, Pool, Switch, SwitchOptions};

/// The guest's kernel and initramfs, when built.
fn guest_image() -> Option<(PathBuf, PathBuf)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/guest");
    let (k, i) = (dir.join("vmlinuz"), dir.join("initrd.img"));
    (k.exists() && i.exists()).then_some((k, i))
}

/// A switch: the pod's AF_PACKET port (opened in `sw`) and the guest's vhost-user port in
/// client mode, one bridge domain, one adaptive PMD thread.
struct Node {
    pmd: Option<PmdSet>,
    _client: knitter_vhost::backend::Server,
    port: Arc<VhostPort>,
    _switch: Arc<Switch>,
}

impl Node {
    fn start(sw: &Netns, socket: &Path) -> Node {
        let pool = Pool::new(8192, false).unwrap();
        let switch = Switch::new(pool.clone(), SwitchOptions::default());
        let pod: Arc<dyn Port> =
            sw.enter(|| AfPacketPort::open("pod", "pod")).unwrap().map(Arc::new).unwrap();
        switch.register_port("pod", pod).unwrap();
        let port = Arc::new(VhostPort::new("vm", pool));
        switch.register_port("vm", port.clone()).unwrap();
        switch.apply(testkit::one_bridge(&["pod", "vm"])).unwrap();
        let client = connect(socket, port.clone()).unwrap();
        let pmd = PmdSet::start(switch.clone(), &PmdConfig { threads: 1, ..PmdConfig::default() })
            .unwrap();
        Node { pmd: Some(pmd), _client: client, port, _switch: switch }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(p) = self.pmd.take() {
            p.stop();
        }
    }
}

/// QEMU with its serial console read line by line; killed on drop.
struct Qemu {
    child: Child,
    console: Arc<Mutex<Vec<String>>>,
}

impl Qemu {
    fn start(kernel: &Path, initrd: &Path, socket: &Path) -> Qemu {
        let mut child = Command::new("qemu-system-x86_64")
            .args([
                "-machine",
                "q35,accel=tcg",
                "-m",
                "256",
                "-smp",
                "2",
                "-display",
                "none",
                "-monitor",
                "none",
            ])
            .args(["-serial", "stdio", "-no-reboot"])
            .arg("-kernel")
            .arg(kernel)
            .arg("-initrd")
            .arg(initrd)
            .args([
                "-append",
                "console=ttyS0 quiet panic=-1 knitter.ip=10.99.0.2/24 knitter.peer=10.99.0.1",
            ])
            .args([
                "-object",
                "memory-backend-memfd,id=mem,size=256M,share=on",
                "-numa",
                "node,memdev=mem",
            ])
            // QEMU listens (client mode for the switch) and starts without waiting for it.
            .arg("-chardev")
            .arg(format!("socket,id=c0,path={},server=on,wait=off", socket.display()))
            .args(["-netdev", "vhost-user,id=n0,chardev=c0,queues=2"])
            // vectors=0: QEMU 7.2 under TCG crashes setting up MSI-X vector notifiers for a
            // vhost device (msix_set_vector_notifiers); INTx works.
            .args(["-device", "virtio-net-pci,netdev=n0,mq=on,vectors=0,mac=52:54:00:12:34:56"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start qemu-system-x86_64");
        let console = Arc::new(Mutex::new(Vec::new()));
        let out = BufReader::new(child.stdout.take().unwrap());
        let lines = console.clone();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line.trim().to_string());
            }
        });
        Qemu { child, console }
    }

    fn lines(&self) -> Vec<String> {
        self.console.lock().unwrap().clone()
    }

    /// Waits until the console shows `what` after line `from`; returns its line number.
    fn wait_for(&self, what: &str, from: usize, within: Duration) -> usize {
        let t = Instant::now();
        loop {
            if let Some(i) = self.lines().iter().skip(from).position(|l| l.contains(what)) {
                return from + i;
            }
            assert!(
                t.elapsed() < within,
                "the guest never said {what:?}; its console:\n{}",
                self.lines().join("\n")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_linux_guest_pings_through_the_switch_and_survives_its_restart() {
    let image = guest_image();
    let ready = vswitch::testkit::runs("qemu-system-x86_64") && image.is_some();
    if !vswitch::testkit::peer_available(
        ready,
        "qemu-system-x86_64 or the guest image",
        "ci/setup.sh and ci/guest.sh",
    ) {
        return;
    }
    let Some(_g) = netns::exclusive() else { return };
    let (kernel, initrd) = image.unwrap();
    let dir = std::env::temp_dir().join(format!("knitter-qemu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("vm.sock");

    let (sw, pod) = (Netns::new("qs").unwrap(), Netns::new("qp").unwrap());
    netns::veth(&pod, "eth0", &sw, "pod").unwrap();
    pod.run(&["ip", "addr", "add", "10.99.0.1/24", "dev", "eth0"]).unwrap();

    let qemu = Qemu::start(&kernel, &initrd, &socket);
    // QEMU creates its socket before the guest boots; the switch connects to it.
    let t = Instant::now();
    while !socket.exists() {
        assert!(t.elapsed() < Duration::from_secs(10), "QEMU did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    let node = Node::start(&sw, &socket);
    let queues = qemu.wait_for("KNITTER-QUEUES", 0, Duration::from_secs(90));
    assert!(
        qemu.lines()[queues].contains("rx-1"),
        "the guest has two queue pairs: {}",
        qemu.lines()[queues]
    );
    let up = qemu.wait_for("KNITTER-UP", queues, Duration::from_secs(60));
    // The guest's driver enabled its second pair (one per vCPU) through the control queue;
    // `ethtool -L eth0 combined 1` takes it away (the switch must then send on the first
    // only: the guest still gets its pings answered) and `combined 2` gives it back.
    let pairs_become = |n: usize| {
        let t = Instant::now();
        while node.port.running_pairs() != n {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the port runs {} pairs, not {n}",
                node.port.running_pairs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let one = qemu.wait_for("KNITTER-COMBINED 1", up, Duration::from_secs(30));
    pairs_become(1);
    let again = qemu.wait_for("KNITTER-UP-ONE-PAIR", one, Duration::from_secs(30));
    let two = qemu.wait_for("KNITTER-COMBINED 2", again, Duration::from_secs(30));
    pairs_become(2);
    let channels = qemu.wait_for("KNITTER-CHANNELS", two, Duration::from_secs(30));
    assert!(qemu.lines()[channels].contains("Combined: 2"), "{}", qemu.lines()[channels]);
    qemu.wait_for("KNITTER-UP", channels, Duration::from_secs(60));

    // The switch restarts: the guest loses its peer, QEMU waits, the new switch connects.
    drop(node);
    let down = qemu.wait_for("KNITTER-DOWN", qemu.lines().len(), Duration::from_secs(30));
    let node = Node::start(&sw, &socket);
    qemu.wait_for("KNITTER-UP", down, Duration::from_secs(60));
    assert!(node.port.link_up());
    drop(qemu);
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}
