//! Installing the CNI plugin binary and writing the network configuration.
//!
//! The conflist is written last of all startup steps: a runtime treats the
//! node's network as ready as soon as a config exists, so it must not
//! appear before the agent can serve ADD. Both files are written to a
//! temporary name in the target directory and renamed into place, so a
//! runtime never reads half a file (nor executes half a binary).

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::error::AgentError;

/// The conflist the plugin reads: one plugin, the agent's socket.
pub fn conflist(socket: &Path) -> serde_json::Value {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "cozyplane",
        "plugins": [{
            "type": "cozyplane",
            "agentSocket": socket,
        }],
    })
}

/// Writes `contents` to `dir/name` atomically with `mode`.
pub fn write_atomic(dir: &Path, name: &str, contents: &[u8], mode: u32) -> Result<(), AgentError> {
    fs::create_dir_all(dir).map_err(|e| AgentError::io("create", dir, e))?;
    let target = dir.join(name);
    // A dot prefix keeps runtimes that scan the directory from loading it.
    let tmp = dir.join(format!(".{name}.tmp"));
    let written = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(contents)?;
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        fs::rename(&tmp, &target)
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(AgentError::io("write", target, e));
    }
    Ok(())
}

/// Writes the conflist.
pub fn write_conflist(dir: &Path, name: &str, socket: &Path) -> Result<(), AgentError> {
    let text = serde_json::to_vec_pretty(&conflist(socket))
        .map_err(|e| AgentError::io("encode", dir.join(name), std::io::Error::other(e)))?;
    write_atomic(dir, name, &text, 0o644)
}

/// Copies the plugin binary into `bin_dir` as `cozyplane`.
pub fn install_plugin(source: &Path, bin_dir: &Path) -> Result<(), AgentError> {
    let bytes = fs::read(source).map_err(|e| AgentError::io("read", source, e))?;
    write_atomic(bin_dir, "cozyplane", &bytes, 0o755)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_conflist_names_the_plugin_and_the_socket_and_is_replaced_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let sock = Path::new("/run/x/agent.sock");
        write_conflist(dir.path(), "10-cozyplane.conflist", sock).unwrap();
        write_conflist(dir.path(), "10-cozyplane.conflist", sock).unwrap();
        let names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["10-cozyplane.conflist".to_string()]);
        let v: serde_json::Value =
            serde_json::from_slice(&fs::read(dir.path().join("10-cozyplane.conflist")).unwrap())
                .unwrap();
        assert_eq!(v["plugins"][0]["type"], "cozyplane");
        assert_eq!(v["plugins"][0]["agentSocket"], "/run/x/agent.sock");
        assert_eq!(v["cniVersion"], "1.0.0");
    }

    #[test]
    fn a_failed_write_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        // The target name is a directory: the rename fails.
        fs::create_dir(dir.path().join("busy")).unwrap();
        fs::write(dir.path().join("busy/x"), b"x").unwrap();
        assert!(write_atomic(dir.path(), "busy", b"data", 0o644).is_err());
        assert!(!dir.path().join(".busy.tmp").exists());
    }
}
