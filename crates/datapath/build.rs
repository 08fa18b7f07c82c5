//! Compiles the C datapath in `bpf/` with clang-19 into `OUT_DIR`.
//!
//! Two objects are built from the same source: the production object and a
//! test object with `-DCP_TEST_HOOKS` (see `bpf/encap.h`), which only the
//! BPF_PROG_TEST_RUN unit tests load.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const CLANG: &str = "clang-19";

fn main() {
    if let Err(msg) = run() {
        // A build script reports errors by failing; the message is the point.
        eprintln!("error: {msg}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
    let bpf_dir = manifest.join("../../bpf");
    let out = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?);

    println!("cargo:rerun-if-changed={}", bpf_dir.display());
    let entries = std::fs::read_dir(&bpf_dir)
        .map_err(|e| format!("cannot read {}: {e}", bpf_dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        println!("cargo:rerun-if-changed={}", path.display());
    }

    let src = bpf_dir.join("cozyplane.bpf.c");
    compile(&bpf_dir, &src, &out.join("cozyplane.bpf.o"), &[])?;
    compile(
        &bpf_dir,
        &src,
        &out.join("cozyplane_test.bpf.o"),
        &["-DCP_TEST_HOOKS"],
    )?;
    Ok(())
}

fn compile(include: &Path, src: &Path, obj: &Path, extra: &[&str]) -> Result<(), String> {
    let output = Command::new(CLANG)
        .args([
            "-O2",
            "-g",
            "-target",
            "bpf",
            "-mcpu=v3",
            "-D__TARGET_ARCH_x86",
        ])
        .args(["-Wall", "-Werror"])
        .arg(format!("-I{}", include.display()))
        .args(extra)
        .arg("-c")
        .arg(src)
        .arg("-o")
        .arg(obj)
        .output()
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                format!(
                    "`{CLANG}` not found: the eBPF datapath is compiled at build time; \
                     install it with `apt-get install clang-19 libbpf-dev`"
                )
            } else {
                format!("cannot run {CLANG}: {e}")
            }
        })?;
    if !output.status.success() {
        return Err(format!(
            "{CLANG} failed to compile {}:\n{}",
            src.display(),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(())
}
