//! The API without DPDK: every entry point says it was not built in.

use crate::{DpdkError, PortOptions};
use std::sync::Arc;

pub mod eal {
    use crate::DpdkError;

    pub fn init(_args: &[String]) -> Result<(), DpdkError> {
        Err(DpdkError::NotBuilt)
    }

    pub fn default_args(_prefix: &str, _pci: &[&str]) -> Vec<String> {
        Vec::new()
    }

    pub fn initialised() -> bool {
        false
    }
}

/// Never made without DPDK.
pub enum DpdkPort {}

impl DpdkPort {
    pub fn open(
        _name: &str,
        _devargs: &str,
        _opts: &PortOptions,
    ) -> Result<Arc<DpdkPort>, DpdkError> {
        Err(DpdkError::NotBuilt)
    }

    pub fn port_id(&self) -> u16 {
        match *self {}
    }

    pub fn zero_copy(&self) -> bool {
        match *self {}
    }

    pub fn copy_reason(&self) -> Option<&str> {
        match *self {}
    }

    pub fn has_link_events(&self) -> bool {
        match *self {}
    }

    pub fn device_stats(&self) -> Option<crate::DeviceStats> {
        match *self {}
    }
}

impl vswitch::port::Port for DpdkPort {
    fn name(&self) -> &str {
        match *self {}
    }

    fn rx_burst(&self, _q: u16, _c: &mut vswitch::PoolCache, _b: &mut vswitch::Batch) -> usize {
        match *self {}
    }

    fn tx_burst(&self, _q: u16, _c: &mut vswitch::PoolCache, _b: &mut vswitch::Batch) -> usize {
        match *self {}
    }
}
