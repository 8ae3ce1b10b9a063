//! Changing members: failing one, hot spares, replacing a drive.

use super::create::refuse_if_claimed;
use super::*;

impl Pool {
    /// The slot of the member at `path` (by identity, so any name for the drive works).
    fn slot_of(&self, path: &Path) -> Result<usize> {
        let want = FileDrive::identity(path).ok();
        let abs = absolute(path);
        let paths = self.member_paths();
        paths
            .iter()
            .position(|p| {
                p.as_ref().is_some_and(|p| {
                    absolute(p) == abs || (want.is_some() && FileDrive::identity(p).ok() == want)
                })
            })
            .ok_or_else(|| {
                PoolError(format!(
                    "{} is not a member of pool '{}'; `millrace pool show {}` lists its members",
                    path.display(),
                    self.name(),
                    self.name()
                ))
            })
    }

    /// Whether the pool would still serve with member `m` gone too.
    fn survives_losing(&self, m: usize) -> bool {
        let geo = self.array.geometry();
        let g = m / geo.group;
        let out = geo
            .group_members(g)
            .filter(|&i| i == m || self.array.member_state(i) != MemberState::Online)
            .count();
        out <= geo.tolerance_per_group()
    }

    /// Takes a member out of service, as a drive failure would. Refused where the pool would
    /// go offline.
    pub fn fail(&self, path: &Path) -> Result<String> {
        let m = self.slot_of(path)?;
        let st = self.array.member_state(m);
        if !matches!(st, MemberState::Online | MemberState::Rebuilding) {
            return err(
                format!("{} is already out of service ({st:?})", path.display()).to_lowercase(),
            );
        }
        if !self.survives_losing(m) {
            return err(format!(
                "failing {} would take pool '{}' offline: its group has no redundancy left to lose",
                path.display(),
                self.name()
            ));
        }
        self.array
            .fail_member(m, &io::Error::other("taken out of service by the admin"));
        let now = self.member_paths()[m].clone();
        Ok(match now {
            Some(p) if p != path && self.array.member_state(m) == MemberState::Rebuilding => {
                format!(
                    "{} failed; hot spare {} took its place and needs rebuilding",
                    path.display(),
                    p.display()
                )
            }
            _ => format!(
                "{} failed; pool '{}' is {}",
                path.display(),
                self.name(),
                self.state()
            ),
        })
    }

    /// Opens a drive to join the pool, checking it is big enough and not someone else's.
    fn claim(&self, path: &Path, force: bool) -> Result<Arc<dyn Drive>> {
        self.check_member_name(path)?;
        let d: Arc<dyn Drive> = Arc::new(
            FileDrive::open(path)
                .map_err(|e| PoolError(format!("cannot open {}: {e}", path.display())))?,
        );
        self.check_newcomer(path, d, force)
    }

    fn check_member_name(&self, path: &Path) -> Result<()> {
        let spares = self.spare_paths();
        if self.slot_of(path).is_ok() || spares.iter().any(|s| absolute(s) == absolute(path)) {
            return err(format!(
                "{} is already part of pool '{}'",
                path.display(),
                self.name()
            ));
        }
        Ok(())
    }

    /// Checks a drive about to join: big enough, and (unless forced) blank.
    fn check_newcomer(
        &self,
        path: &Path,
        d: Arc<dyn Drive>,
        force: bool,
    ) -> Result<Arc<dyn Drive>> {
        let sb = self.superblock();
        let need = sb.data_offset + sb.member_data_bytes;
        if d.size_bytes() < need {
            return err(format!(
                "{} is too small for pool '{}': it holds {} bytes, and a member needs {need}",
                path.display(),
                sb.name,
                d.size_bytes()
            ));
        }
        if !force {
            refuse_if_claimed(path, d.as_ref())?;
        }
        Ok(d)
    }

    /// Adds a hot spare. If a member is already out of service, the spare takes its place now.
    pub fn add_spare(&self, path: &Path, force: bool) -> Result<String> {
        let d = self.claim(path, force)?;
        {
            let mut sb = self.meta.sb.lock();
            if sb.table.len() >= crate::geometry::MAX_MEMBERS {
                return err("the pool has no room for more spares");
            }
            sb.table.push((Uuid::new_v4(), MemberState::Spare));
            self.meta.spares.lock().push((d, path.to_path_buf()));
            let mut copy = sb.clone();
            self.meta
                .commit(&mut copy)
                .map_err(|e| PoolError(format!("cannot record the spare: {e}")))?;
            *sb = copy;
        }
        let out = (0..self.array.geometry().members).find(|&m| {
            matches!(
                self.array.member_state(m),
                MemberState::Faulty | MemberState::Missing
            )
        });
        if let Some(m) = out {
            self.meta
                .member_failed(m, &io::Error::other("out of service"));
            return Ok(format!(
                "{} added as a hot spare and put in place of member {m}, which was out of service; rebuild it with `millrace pool rebuild {}`",
                path.display(),
                self.name()
            ));
        }
        Ok(format!(
            "{} added as a hot spare of pool '{}'",
            path.display(),
            self.name()
        ))
    }

    /// Puts `new` in place of member `old` and marks it for rebuilding. A member still in
    /// service is taken out first, where the pool survives that.
    pub fn replace(&self, old: &Path, new: &Path, force: bool) -> Result<String> {
        self.slot_of(old)?;
        let d = self.claim(new, force)?;
        self.install(old, new, d)
    }

    /// `replace` with a drive already open (a block device opened elsewhere, or a test drive).
    pub fn replace_with(&self, old: &Path, new: &Path, d: Arc<dyn Drive>) -> Result<String> {
        self.slot_of(old)?;
        self.check_member_name(new)?;
        let d = self.check_newcomer(new, d, false)?;
        self.install(old, new, d)
    }

    fn install(&self, old: &Path, new: &Path, d: Arc<dyn Drive>) -> Result<String> {
        let m = self.slot_of(old)?;
        if matches!(
            self.array.member_state(m),
            MemberState::Online | MemberState::Rebuilding
        ) {
            if !self.survives_losing(m) {
                return err(format!(
                    "replacing {} would take pool '{}' offline while the new drive is rebuilt",
                    old.display(),
                    self.name()
                ));
            }
            // Out of service first (this records it), without handing the slot to a spare.
            let spares = std::mem::take(&mut *self.meta.spares.lock());
            self.array
                .fail_member(m, &io::Error::other("being replaced by the admin"));
            *self.meta.spares.lock() = spares;
        }
        let mut sb = self.meta.sb.lock();
        sb.table[m] = (Uuid::new_v4(), MemberState::Rebuilding);
        sb.rebuild_checkpoint = 0;
        self.array.install_member(m, d, 0);
        self.meta.paths.lock()[m] = Some(new.to_path_buf());
        let mut copy = sb.clone();
        self.meta
            .commit(&mut copy)
            .map_err(|e| PoolError(format!("cannot record the replacement: {e}")))?;
        *sb = copy;
        Ok(format!(
            "{} replaces {} in pool '{}'",
            new.display(),
            old.display(),
            sb.name
        ))
    }
}
