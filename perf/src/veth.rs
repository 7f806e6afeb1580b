//! The topology of the kernel-interface scenario: two veth pairs between a generator
//! namespace (`ga`, `gb`) and a switch namespace (`sa`, `sb`), as a node's pods are joined
//! to the switch. Both namespaces are made for one trial and removed when it ends, even
//! after a failure; IPv6 is off in them so the kernel sends nothing of its own through the
//! switch (router solicitations, MLD reports), and no address is set: only the generator's
//! frames cross.

use vswitch::testkit::netns::{self, Netns};

/// The generator's ends and the switch's.
pub const GEN_A: &str = "ga";
pub const GEN_B: &str = "gb";
pub const SW_A: &str = "sa";
pub const SW_B: &str = "sb";

/// Two namespaces and the veth pairs between them.
pub struct Veths {
    pub generator: Netns,
    pub switch: Netns,
}

impl Veths {
    pub fn new() -> anyhow::Result<Veths> {
        let (generator, switch) = (Netns::new("pg")?, Netns::new("ps")?);
        for ns in [&generator, &switch] {
            for key in ["all", "default"] {
                ns.run(&["sysctl", "-qw", &format!("net.ipv6.conf.{key}.disable_ipv6=1")])?;
            }
        }
        netns::veth(&generator, GEN_A, &switch, SW_A)?;
        netns::veth(&generator, GEN_B, &switch, SW_B)?;
        Ok(Veths { generator, switch })
    }

    /// The Linux bridge between the switch's ends (`br0`), the kernel's own switch.
    pub fn bridge(&self) -> anyhow::Result<()> {
        let ns = &self.switch;
        ns.run(&["ip", "link", "add", "br0", "type", "bridge"])?;
        for dev in [SW_A, SW_B] {
            ns.run(&["ip", "link", "set", dev, "master", "br0"])?;
        }
        ns.run(&["ip", "link", "set", "br0", "up"])?;
        Ok(())
    }
}
