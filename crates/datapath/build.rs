//! Compiles the C datapath in `bpf/` with clang-19 into `OUT_DIR`.
//!
//! Two objects are built from the same source: the production object and a
//! test object with `-DCP_TEST_HOOKS` (see `bpf/encap.h`), which only the
//! BPF_PROG_TEST_RUN unit tests load.

use std::env;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use cozyplane_errors::Chain;

const CLANG: &str = "clang-19";

/// Why the datapath could not be built.
#[derive(Debug, thiserror::Error)]
enum BuildError {
    /// A variable cargo sets for build scripts is missing.
    #[error("${0} is not set (cargo sets it for build scripts)")]
    Env(&'static str, #[source] env::VarError),
    /// The `bpf/` directory could not be listed.
    #[error("cannot read {}", .0.display())]
    ReadDir(PathBuf, #[source] io::Error),
    /// clang-19 is not installed.
    #[error(
        "`{CLANG}` not found: the eBPF datapath is compiled at build time; \
         install it with `apt-get install clang-19 libbpf-dev`"
    )]
    NoClang,
    /// clang-19 could not be started.
    #[error("cannot run {CLANG}")]
    Spawn(#[source] io::Error),
    /// The C did not compile; clang's diagnostics follow.
    #[error("{CLANG} failed to compile {}:\n{stderr}", .src.display())]
    Compile {
        /// The source file.
        src: PathBuf,
        /// clang's standard error.
        stderr: String,
    },
}

fn main() {
    if let Err(e) = run() {
        // A build script reports errors by failing; the message is the point.
        eprintln!("error: {}", Chain(&e));
        std::process::exit(1);
    }
}

fn var(name: &'static str) -> Result<PathBuf, BuildError> {
    env::var(name)
        .map(PathBuf::from)
        .map_err(|e| BuildError::Env(name, e))
}

fn run() -> Result<(), BuildError> {
    let manifest = var("CARGO_MANIFEST_DIR")?;
    let bpf_dir = manifest.join("../../bpf");
    let out = var("OUT_DIR")?;

    println!("cargo:rerun-if-changed={}", bpf_dir.display());
    let read_dir = |e| BuildError::ReadDir(bpf_dir.clone(), e);
    let entries = std::fs::read_dir(&bpf_dir).map_err(read_dir)?;
    for entry in entries {
        let path = entry.map_err(read_dir)?.path();
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

fn compile(include: &Path, src: &Path, obj: &Path, extra: &[&str]) -> Result<(), BuildError> {
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
            if e.kind() == io::ErrorKind::NotFound {
                BuildError::NoClang
            } else {
                BuildError::Spawn(e)
            }
        })?;
    if !output.status.success() {
        return Err(BuildError::Compile {
            src: src.to_path_buf(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    Ok(())
}
