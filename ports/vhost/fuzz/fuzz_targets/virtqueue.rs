//! Any rings over a small guest memory of any bytes, run as a vhost-user port's queue pair
//! by the PMD-side code; fails on a panic or a leaked buffer. Input format: see
//! `knitter_vhost::testkit::fuzz::virtqueue`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    knitter_vhost::testkit::fuzz::virtqueue(data);
});
