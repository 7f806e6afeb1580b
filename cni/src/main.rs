//! knitter-cni: run by the container runtime (or Multus) with the CNI environment and the
//! network configuration on stdin; prints the result (or a CNI error result) on stdout.

#![forbid(unsafe_code)]

use std::io::Read;

fn main() {
    let env = match knitter_cni::spec::Env::read(|k| std::env::var(k).ok()) {
        Ok(e) => e,
        Err(e) => fail(&e, "1.1.0"),
    };
    let mut stdin = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut stdin) {
        fail(
            &knitter_cni::spec::CniError::new(
                knitter_cni::spec::Code::Io,
                format!("reading the configuration: {e}"),
            ),
            "1.1.0",
        );
    }
    match knitter_cni::run(&env, &stdin) {
        Ok(Some(v)) => println!("{v}"),
        Ok(None) => {}
        Err((e, version)) => fail(&e, &version),
    }
}

fn fail(e: &knitter_cni::spec::CniError, version: &str) -> ! {
    println!("{}", e.to_json(version));
    eprintln!("knitter-cni: {}", e.msg);
    std::process::exit(1)
}
