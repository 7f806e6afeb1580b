//! Node `learn`: MAC learning beyond the common case (the source already known here and
//! refreshed this second is checked inline by `forward`, without a write).

use super::trace::key_mac;
use super::{Ctx, NO_PEER, Pipeline};
use crate::counters::Event;
use crate::descriptor::{Descriptor, Next};
use crate::fdb::{Dest, Learn, Limits};
use crate::snapshot::{BdEntry, PortEntry};
use crate::trace::{Learned, Node, Step};

/// Node `learn`, as [`crate::graph`] collects it.
pub(crate) const NODE: Descriptor = Descriptor {
    node: Node::Learn,
    name: "learn",
    nexts: &[Next::Node(Node::Suppress), Next::Node(Node::Forward)],
    drops: &[],
    counts: &[
        Event::Learned,
        Event::MacMoved,
        Event::StaticMoveRefused,
        Event::LearnLimit,
        Event::LearnBusy,
    ],
};

impl Pipeline {
    /// Learning beyond the common case (a MAC that is new, moved, static, or last refreshed
    /// in an earlier second).
    /// Returns whether the FDB now holds the source behind `src` (false when a static entry,
    /// a limit or a busy bucket stopped it).
    #[inline(never)]
    pub(super) fn learn(&mut self, port: &PortEntry, bd: &BdEntry, c: &Ctx, src: Dest) -> bool {
        let from_peer = c.from_peer != NO_PEER;
        let limits = Limits {
            bd_max: bd.mac_limit,
            port_max: if from_peer { u32::MAX } else { port.mac_limit },
        };
        if self.dry() {
            self.record(Step::Learn {
                bd: bd.id,
                mac: key_mac(c.src_key),
                outcome: Learned::WouldLearn,
            });
            return true;
        }
        let learned = self.fdb.learn(c.src_key, c.src_loc, src, self.now, limits);
        if self.trace.on {
            let outcome = match learned {
                Learn::Unchanged => Learned::Fresh,
                Learn::Refreshed => Learned::Refreshed,
                Learn::Learned => Learned::New,
                Learn::Moved => Learned::Moved,
                Learn::StaticRefused => Learned::StaticRefused,
                Learn::Limit => Learned::Limit,
                Learn::Busy => Learned::Busy,
            };
            self.record(Step::Learn { bd: bd.id, mac: key_mac(c.src_key), outcome });
        }
        let (event, done) = match learned {
            Learn::Unchanged | Learn::Refreshed => return true,
            Learn::Learned => {
                self.stats.bd(bd.id).learned.add(1);
                (Event::Learned, true)
            }
            Learn::Moved => (Event::MacMoved, true),
            Learn::StaticRefused => (Event::StaticMoveRefused, false),
            Learn::Limit => (Event::LearnLimit, false),
            Learn::Busy => (Event::LearnBusy, false),
        };
        self.stats.event(event, 1);
        done
    }
}
