//! The CNI plugin executable: environment and stdin in, JSON on stdout,
//! exit status 0 or 1. Everything else lives in the library.

use std::io::Write;
use std::process::ExitCode;

use cozyplane_cni::env::process_getenv;
use cozyplane_cni::plugin::run;

fn main() -> ExitCode {
    let outcome = run(
        &process_getenv,
        &mut std::io::stdin().lock(),
        &mut std::io::stderr(),
    );
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(&outcome.stdout).and_then(|()| out.flush()) {
        // nowhere left to report but stderr; a lost result must not look like success
        let _ = writeln!(std::io::stderr(), "cozyplane-cni: cannot write stdout: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::from(outcome.exit_code)
}
