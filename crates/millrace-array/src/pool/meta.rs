//! The pool-wide metadata the engine's failure hook shares: the superblock, spares and paths.

use super::*;

/// The pool-wide metadata, shared with the engine's failure hook.
pub(super) struct Meta {
    pub(super) sb: Mutex<Superblock>,
    pub(super) array: OnceLock<Weak<Array>>,
    /// Hot spares, in the order of their superblock table entries (after the members).
    pub(super) spares: Mutex<Vec<(Arc<dyn Drive>, PathBuf)>>,
    /// Member paths in layout order (None where a member was never found).
    pub(super) paths: Mutex<Vec<Option<PathBuf>>>,
}

impl Meta {
    pub(super) fn array(&self) -> Option<Arc<Array>> {
        self.array.get().and_then(|w| w.upgrade())
    }

    /// Writes the current description, one event newer, to every member still in service and
    /// to every spare. The caller holds the `sb` lock.
    pub(super) fn commit(&self, sb: &mut Superblock) -> io::Result<()> {
        sb.events += 1;
        // A version-1 pool becomes version 2 here: its journal was dealt with at import.
        sb.format = crate::superblock::VERSION;
        let at = sb.slot() * SLOT_BYTES as u64;
        let drives = self.array().map(|a| a.drives()).unwrap_or_default();
        let spares = self.spares.lock().clone();
        let mut written = 0;
        let mut last_err = None;
        for i in 0..sb.table.len() {
            if !matches!(
                sb.table[i].1,
                MemberState::Online | MemberState::Rebuilding | MemberState::Spare
            ) {
                continue;
            }
            let d = if i < sb.members {
                drives.get(i).cloned()
            } else {
                spares.get(i - sb.members).map(|s| s.0.clone())
            };
            let Some(d) = d else { continue };
            let mut me = sb.clone();
            me.member_index = i;
            me.member_uuid = sb.table[i].0;
            let buf = AlignedBuf::from_slice(&me.encode());
            match d.write_at(&buf, at).and_then(|_| d.flush()) {
                Ok(()) => written += 1,
                Err(e) => last_err = Some(e),
            }
        }
        match (written, last_err) {
            (0, Some(e)) => Err(e),
            _ => Ok(()),
        }
    }

    /// A member failed: record it, and put the first hot spare in its place to be rebuilt.
    pub(super) fn member_failed(&self, member: usize, why: &io::Error) {
        let mut sb = self.sb.lock();
        sb.table[member].1 = MemberState::Faulty;
        if let Some(array) = self.array() {
            let mut spares = self.spares.lock();
            if !spares.is_empty() && sb.table.len() > sb.members {
                let (drive, path) = spares.remove(0);
                let first_spare = sb.members;
                let entry = sb.table.remove(first_spare);
                drop(spares);
                sb.table[member] = (entry.0, MemberState::Rebuilding);
                sb.rebuild_checkpoint = 0;
                array.install_member(member, drive, 0);
                tracing::warn!(
                    "hot spare {} takes the place of member {member}; rebuild it with `millrace pool rebuild`",
                    path.display()
                );
                self.paths.lock()[member] = Some(path);
            }
        }
        if let Err(e) = self.commit(&mut sb) {
            tracing::error!("could not record that member {member} failed ({why}): {e}");
        }
    }
}
