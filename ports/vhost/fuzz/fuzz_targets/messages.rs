//! Any sequence of vhost-user messages, with any payload and any descriptors attached, to
//! the backend a port serves; fails on a panic (or a hang, which libFuzzer's timeout
//! reports). Input format: see `knitter_vhost::testkit::fuzz::messages`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    knitter_vhost::testkit::fuzz::messages(data);
});
