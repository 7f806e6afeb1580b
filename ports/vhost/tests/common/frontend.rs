//! A vhost-user frontend as QEMU or DPDK's virtio-user drives one, for tests: rust-vmm's
//! `Frontend` on the port's socket, a memfd as guest memory, rings set up and enabled, and
//! simulated guest queues (`knitter_vhost::testkit::Guest`) in that memory. Shared by the
//! vhost-user tests and the daemon's (`#[path]`).
#![allow(dead_code)] // each test binary uses its own part

use knitter_vhost::backend::FEATURES;
use knitter_vhost::memory::{GuestMemory, Mapping};
use knitter_vhost::testkit::{Guest, MEM_LEN};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vmm_sys_util::eventfd::EventFd;

pub fn memfd(len: usize) -> OwnedFd {
    // SAFETY: memfd_create with a static name; the descriptor is owned below.
    let fd = unsafe { libc::memfd_create(c"knitter-guest".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create");
    // SAFETY: fd was just created and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate on our own descriptor.
    assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), len as i64) }, 0);
    fd
}

/// A frontend with its guest memory and the guest's queues (pair 0's two, then the
/// others' in virtqueue order).
pub struct Vm {
    pub fe: Frontend,
    pub rx: Guest,
    pub tx: Guest,
    pub more: Vec<Guest>,
    /// The memory table's one region (its fd stays open for a later SET_MEM_TABLE).
    pub region: VhostUserMemoryRegionInfo,
    pub memfd: OwnedFd,
    /// Each ring's call and kick eventfds, in virtqueue order.
    pub events: Vec<EventFd>,
}

pub fn frontend(path: &std::path::Path) -> Vm {
    set_up(Frontend::connect(path, 2).expect("connect to the port's socket"))
}

/// Sets up a connected frontend as QEMU or virtio-user would, with one queue pair.
pub fn set_up(fe: Frontend) -> Vm {
    set_up_pairs(fe, 1)
}

pub fn set_up_pairs(fe: Frontend, pairs: usize) -> Vm {
    set_up_with(fe, pairs, |_| {})
}

/// `set_up_pairs`, with `after_mem_table` run on the memory file once the switch has it.
pub fn set_up_with(fe: Frontend, pairs: usize, after_mem_table: impl FnOnce(&OwnedFd)) -> Vm {
    set_up_on(fe, memfd(MEM_LEN), MEM_LEN, pairs, after_mem_table)
}

/// `set_up_with` on the memory file `fd` (at least `MEM_LEN` bytes), of which the memory
/// table names the first `region_len` bytes.
pub fn set_up_on(
    mut fe: Frontend,
    fd: OwnedFd,
    region_len: usize,
    pairs: usize,
    after_mem_table: impl FnOnce(&OwnedFd),
) -> Vm {
    let map = Mapping::shared(fd.as_fd(), 0, MEM_LEN).unwrap();
    let user = map.as_ptr() as u64;
    let mem = Arc::new(GuestMemory::new(vec![(0, user, map)]).unwrap());
    let mut queues: Vec<Guest> =
        (0..2 * pairs as u64).map(|k| Guest::queue_in(mem.clone(), 64, k)).collect();
    let region = VhostUserMemoryRegionInfo {
        guest_phys_addr: 0,
        memory_size: region_len as u64,
        userspace_addr: user,
        mmap_offset: 0,
        mmap_handle: fd.as_raw_fd(),
    };
    let events =
        negotiate(&mut fe, &region, &queues.iter().collect::<Vec<_>>(), || after_mem_table(&fd));
    let more = queues.split_off(2);
    let tx = queues.pop().unwrap();
    let rx = queues.pop().unwrap();
    Vm { fe, rx, tx, more, region, memfd: fd, events }
}

/// The protocol from SET_OWNER to enabled rings, for `queues` in `region` (each ring from
/// base 0, as DPDK's virtio-user always sends). Returns the call and kick eventfds.
pub fn negotiate(
    fe: &mut Frontend,
    region: &VhostUserMemoryRegionInfo,
    queues: &[&Guest],
    after_mem_table: impl FnOnce(),
) -> Vec<EventFd> {
    fe.set_owner().unwrap();
    let features = fe.get_features().unwrap();
    assert_eq!(features, FEATURES);
    fe.set_features(features & !knitter_vhost::backend::VIRTIO_F_RING_PACKED).unwrap(); // drives split rings
    let pf = fe.get_protocol_features().unwrap();
    assert!(pf.contains(VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::MQ));
    fe.set_protocol_features(pf).unwrap();
    assert_eq!(fe.get_queue_num().unwrap(), knitter_vhost::port::MAX_PAIRS as u64);
    fe.set_mem_table(std::slice::from_ref(region)).unwrap();
    // A request with a reply: once answered, the port has mapped the table.
    fe.get_queue_num().unwrap();
    after_mem_table();
    let user = region.userspace_addr;
    let mut events = Vec::new();
    for (i, g) in queues.iter().enumerate() {
        fe.set_vring_num(i, g.size).unwrap();
        let cfg = VringConfigData {
            queue_max_size: g.size,
            queue_size: g.size,
            flags: 0,
            desc_table_addr: user + g.desc,
            used_ring_addr: user + g.used,
            avail_ring_addr: user + g.avail,
            log_addr: None,
        };
        fe.set_vring_addr(i, &cfg).unwrap();
        fe.set_vring_base(i, 0).unwrap();
        let (call, kick) = (EventFd::new(0).unwrap(), EventFd::new(0).unwrap());
        fe.set_vring_call(i, &call).unwrap();
        fe.set_vring_kick(i, &kick).unwrap();
        fe.set_vring_enable(i, true).unwrap();
        events.extend([call, kick]);
    }
    start_driver(&events);
    events
}

/// What a driver does once its rings are set up and filled: it kicks its receive rings
/// (DPDK's virtio-user at the end of `rte_eth_dev_start`), which tells the port that frames
/// sent to it from then on are read. `events` holds each ring's call and kick eventfds.
pub fn start_driver(events: &[EventFd]) {
    for kick in events.chunks(2).step_by(2).filter_map(|e| e.get(1)) {
        kick.write(1).unwrap();
    }
}
