//! The whole pipeline on arbitrary frames offered on every port kind (pod with port
//! security, access, trunk, 802.1ad trunk, VXLAN underlay); fails on a panic or a leaked
//! buffer. Input format: see `vswitch::testkit::fuzz`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::cell::RefCell;
use vswitch::testkit::{Harness, fuzz};

thread_local! {
    static H: RefCell<Harness> = RefCell::new(fuzz::harness());
}

fuzz_target!(|data: &[u8]| {
    H.with(|h| fuzz::run(&mut h.borrow_mut(), data));
});
