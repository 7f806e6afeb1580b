//! The veth topologies of the kernel scenarios: two veth pairs between a generator
//! namespace (`ga`, `gb`) and a switch namespace (`sa`, `sb`), as a node's pods are joined
//! to the switch ([`Veths`]); or one veth pair between two "nodes" (`u1`, `u2`), the
//! underlay of two VTEPs ([`Underlay`]). Namespaces are made for one trial and removed when
//! it ends, even after a failure; IPv6 is off in them so the kernel sends nothing of its own
//! through the switch (router solicitations, MLD reports), and no address is set: only the
//! generator's frames (and the switches' ARP) cross.

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
        let (generator, switch) = (Netns::quiet("pg")?, Netns::quiet("ps")?);
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

/// The underlay ends of the two nodes.
pub const NODE_1: &str = "u1";
pub const NODE_2: &str = "u2";

/// The underlay's MTU: room for VXLAN's 50 bytes around a 1 500-byte inner packet, as a
/// VXLAN deployment gives its underlay (else IMIX's 1518-byte frames would not fit).
pub const UNDERLAY_MTU: u16 = 1600;

/// Two node namespaces joined by a veth pair, each node's end its VTEP's underlay.
pub struct Underlay {
    pub nodes: [Netns; 2],
}

impl Underlay {
    pub fn new() -> anyhow::Result<Underlay> {
        let nodes = [Netns::quiet("n1")?, Netns::quiet("n2")?];
        netns::veth(&nodes[0], NODE_1, &nodes[1], NODE_2)?;
        for (ns, dev) in [(&nodes[0], NODE_1), (&nodes[1], NODE_2)] {
            ns.run(&["ip", "link", "set", dev, "mtu", &UNDERLAY_MTU.to_string()])?;
        }
        Ok(Underlay { nodes })
    }
}
