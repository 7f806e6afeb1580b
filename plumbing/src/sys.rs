//! The socket plumbing the kernel-backed ports share (AF_PACKET, AF_XDP): errno checks,
//! typed `setsockopt`, interface index and MAC lookups. Control path only.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use vswitch::wire::MacAddr;

/// A libc return value as a `Result`: negative means `errno` says why.
pub fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
}

/// `setsockopt` with a typed value.
pub fn setopt<T>(fd: RawFd, level: libc::c_int, name: libc::c_int, val: &T) -> io::Result<()> {
    // SAFETY: `val` points at a live T of the size passed.
    check(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (val as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// The index of `ifname` in the calling thread's network namespace.
pub fn ifindex(ifname: &str) -> io::Result<u32> {
    let c = CString::new(ifname)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name"))?;
    // SAFETY: a valid C string.
    match unsafe { libc::if_nametoindex(c.as_ptr()) } {
        0 => Err(io::Error::new(io::ErrorKind::NotFound, format!("no interface {ifname:?}"))),
        i => Ok(i),
    }
}

/// The interface's MAC in the calling thread's network namespace (through a throwaway socket:
/// not every socket family answers the ioctl).
pub fn interface_mac(ifname: &str) -> Option<MacAddr> {
    if_mac(control_socket().ok()?.as_raw_fd(), ifname)
}

/// A socket for interface ioctls in the calling thread's network namespace (AF_XDP sockets
/// answer none themselves).
pub fn control_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation; the result is checked and owned below.
    let fd =
        check(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An ifreq naming `ifname`, or `None` when the name does not fit.
fn ifreq(ifname: &str) -> Option<libc::ifreq> {
    // SAFETY: ifreq is plain data; zeroed is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let name = ifname.as_bytes();
    if name.len() >= req.ifr_name.len() {
        return None;
    }
    for (d, s) in req.ifr_name.iter_mut().zip(name) {
        *d = *s as libc::c_char;
    }
    Some(req)
}

/// Whether the interface is up and running (carrier), asked of the socket's own network
/// namespace; `None` when the kernel does not say (the interface is gone).
pub fn if_running(fd: RawFd, ifname: &str) -> Option<bool> {
    let mut req = ifreq(ifname)?;
    // SAFETY: SIOCGIFFLAGS fills the ifreq we pass.
    if unsafe { libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req) } != 0 {
        return None;
    }
    // SAFETY: after SIOCGIFFLAGS the union holds ifru_flags.
    let flags = unsafe { req.ifr_ifru.ifru_flags } as libc::c_int;
    Some(flags & libc::IFF_UP != 0 && flags & libc::IFF_RUNNING != 0)
}

/// How many receive queues the interface has (its rx or combined channels, the larger),
/// asked of the socket's own network namespace; `None` when the driver does not say.
pub fn rx_queues(fd: RawFd, ifname: &str) -> Option<u32> {
    const ETHTOOL_GCHANNELS: u32 = 0x3c;
    // struct ethtool_channels: cmd, max_rx, max_tx, max_other, max_combined, rx_count,
    // tx_count, other_count, combined_count.
    let mut ch = [0u32; 9];
    ch[0] = ETHTOOL_GCHANNELS;
    let mut req = ifreq(ifname)?;
    req.ifr_ifru.ifru_data = ch.as_mut_ptr().cast();
    // SAFETY: SIOCETHTOOL with ETHTOOL_GCHANNELS writes one ethtool_channels (9 u32) to the
    // buffer ifru_data points at, which lives until the call returns.
    if unsafe { libc::ioctl(fd, libc::SIOCETHTOOL, &mut req) } != 0 {
        return None;
    }
    Some(ch[5].max(ch[8]))
}

/// Whether the interface has no bus device behind it (veth, tap: a software device whose
/// senders are this host's own kernel), asked of the socket's own network namespace; `None`
/// when the driver does not say.
pub fn is_software_device(fd: RawFd, ifname: &str) -> Option<bool> {
    const ETHTOOL_GDRVINFO: u32 = 0x03;
    // struct ethtool_drvinfo: cmd, driver[32], version[32], fw_version[32], bus_info[32],
    // erom_version[32], reserved2[12], five u32 counts: 196 bytes.
    let mut info = [0u8; 196];
    info[..4].copy_from_slice(&ETHTOOL_GDRVINFO.to_ne_bytes());
    let mut req = ifreq(ifname)?;
    req.ifr_ifru.ifru_data = info.as_mut_ptr().cast();
    // SAFETY: SIOCETHTOOL with ETHTOOL_GDRVINFO writes one ethtool_drvinfo (196 bytes) to the
    // buffer ifru_data points at, which lives until the call returns.
    if unsafe { libc::ioctl(fd, libc::SIOCETHTOOL, &mut req) } != 0 {
        return None;
    }
    const BUS_INFO: usize = 4 + 3 * 32;
    Some(info[BUS_INFO] == 0)
}

/// The interface's MTU, asked of the socket's own network namespace; `None` when the
/// kernel does not say.
pub fn if_mtu(fd: RawFd, ifname: &str) -> Option<u32> {
    let mut req = ifreq(ifname)?;
    // SAFETY: SIOCGIFMTU fills the ifreq we pass.
    if unsafe { libc::ioctl(fd, libc::SIOCGIFMTU, &mut req) } != 0 {
        return None;
    }
    // SAFETY: after SIOCGIFMTU the union holds ifru_mtu.
    u32::try_from(unsafe { req.ifr_ifru.ifru_mtu }).ok()
}

/// The interface's MAC, asked of the socket's own network namespace (sysfs would answer for
/// the mount namespace's, which differs when the caller entered another netns).
pub fn if_mac(fd: RawFd, ifname: &str) -> Option<MacAddr> {
    let mut req = ifreq(ifname)?;
    // SAFETY: SIOCGIFHWADDR fills the ifreq we pass.
    if unsafe { libc::ioctl(fd, libc::SIOCGIFHWADDR, &mut req) } != 0 {
        return None;
    }
    // SAFETY: after SIOCGIFHWADDR the union holds ifru_hwaddr.
    let sa = unsafe { req.ifr_ifru.ifru_hwaddr };
    let mut m = [0u8; 6];
    for (d, s) in m.iter_mut().zip(sa.sa_data.iter()) {
        *d = *s as u8;
    }
    Some(MacAddr(m))
}
