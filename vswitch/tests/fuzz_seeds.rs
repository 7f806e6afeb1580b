//! Keeps the fuzz corpus seeds in `fuzz/corpus/` in step with the sample frames: each seed
//! is a valid input (one record) for the `pipeline` target, and its frame seeds `wire`.
//! Run with `KNITTER_WRITE_SEEDS=1` to rewrite them.

use vswitch::testkit::fuzz;

#[test]
fn fuzz_seeds_are_current() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let write = std::env::var_os("KNITTER_WRITE_SEEDS").is_some();
    for (name, port, f) in fuzz::samples() {
        let rec = fuzz::record(port, &f);
        for (target, bytes) in [("pipeline", &rec), ("wire", &f)] {
            let path = dir.join(target).join(format!("{name}.bin"));
            if write {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, bytes).unwrap();
            } else {
                let have = std::fs::read(&path).unwrap_or_default();
                assert_eq!(
                    &have,
                    bytes,
                    "{} is stale: run with KNITTER_WRITE_SEEDS=1",
                    path.display()
                );
            }
        }
    }
}
