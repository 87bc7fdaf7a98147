//! The keyring file (`auth.token_secret_file`): rotated in place by
//! `stampede rotate-token-secret`, re-read every second by a running core.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use anyhow::Context;

use super::token::{Keyring, TokenSigner, rotated};
use crate::shutdown::Shutdown;

/// Rewrites the keyring file atomically (mode 0600): a new current secret, the old
/// current kept as previous, any older one dropped. Returns the key ids now in it.
pub fn rotate_file(path: &Path) -> anyhow::Result<Vec<String>> {
    let current =
        std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let next = rotated(&current).context("the keyring in force")?;
    let tmp = path.with_extension("rotating");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("write {}", tmp.display()))?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(next.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("replace {}", path.display()))?;
    Ok(Keyring::parse(&next)?
        .ids()
        .into_iter()
        .map(str::to_owned)
        .collect())
}

/// Re-reads the keyring file every second until `stop`: a rotation takes effect
/// without a restart, and tokens of the previous secret stay valid.
pub async fn watch(tokens: &TokenSigner, path: &Path, mut stop: Shutdown) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tick.tick() => match tokens.reload_from(path) {
                Ok(Some(ids)) => {
                    failing = false;
                    tracing::info!(key_ids = ?ids, "token keyring reloaded: the first signs, all verify");
                }
                Ok(None) => failing = false,
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(path = %path.display(), error = format!("{e:#}"), "token keyring not reloaded; keeping the keys in force");
                }
                Err(_) => {}
            },
            _ = stop.wait() => return,
        }
    }
}
