//! A disk that fails on command: a FUSE file system that passes every call through to a
//! backing directory, until the test tells it to answer writes and syncs with EIO. The
//! gateway sees the kernel's own EIO from write(2) and fsync(2), as from a dying disk;
//! nothing in the gateway knows it is under test.
//!
//! A volatile mount ([`EioMount::new_volatile`]) is a disk with a write cache: a file's
//! writes are held in memory until an fsync of that file, and [`EioMount::power_cut`]
//! drops whatever is still held. A SIGKILL cannot show a missing sync (the kernel's page
//! cache outlives the process); this can. [`EioMount::delay_syncs`] and
//! [`EioMount::freeze`] put the power cut at an instant of the test's choosing, a sync
//! still on its way included. Directory changes (create, rename, unlink) reach the disk at
//! once, so a missing sync of a folder goes unseen; and an O_DSYNC write syncs all of its
//! file's cached writes, where ext4 syncs its own range.
//!
//! Served by a thread of the test process (fuser, mounted with mount(2): root, as CI has).
//! Unmounted on drop; drop the gateway first, so that nothing holds a file open.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, Metadata, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, Filesystem,
    FopenFlags, Generation, INodeNo, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, Request, TimeOrNow, WriteFlags,
};

/// What the disk does with writes and syncs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Fault {
    /// Everything passes through.
    None = 0,
    /// Every write and every sync fails with EIO; nothing reaches the backing file.
    WritesAndSyncs = 1,
    /// Writes reach the backing file, but every sync fails with EIO: the data may or may
    /// not be on the disk, and the writer cannot tell.
    Syncs = 2,
    /// As `WritesAndSyncs`, for the files whose name ends in `-journal` only: the
    /// database opens, and the mutex's first record fails without reaching the disk.
    JournalWrites = 3,
    /// As a file system the kernel remounted read-only after errors: every write, sync,
    /// create, open for writing, truncate, unlink and rename fails with EROFS.
    ReadOnly = 4,
}

/// The kernel may cache nothing: every call must reach us, so that a fault takes effect at
/// once and no cached attribute hides a write that failed.
const TTL: Duration = Duration::ZERO;

pub struct EioMount {
    mountpoint: PathBuf,
    fault: Arc<AtomicU8>,
    power: Arc<Power>,
    state: Arc<Mutex<State>>,
    session: Option<BackgroundSession>,
}

impl EioMount {
    /// Mounts, on `mountpoint`, the contents of `backing`.
    pub fn new(mountpoint: &Path, backing: &Path) -> EioMount {
        EioMount::mount(mountpoint, backing, false)
    }

    /// As [`EioMount::new`], with a volatile write cache: a write reaches `backing` only
    /// at an fsync of its file (or as an O_DSYNC write), and [`EioMount::power_cut`]
    /// loses it before that. Reads, sizes and truncates see the cached writes.
    pub fn new_volatile(mountpoint: &Path, backing: &Path) -> EioMount {
        EioMount::mount(mountpoint, backing, true)
    }

    fn mount(mountpoint: &Path, backing: &Path, volatile: bool) -> EioMount {
        let fault = Arc::new(AtomicU8::new(Fault::None as u8));
        let power = Arc::new(Power::default());
        let state = Arc::new(Mutex::new(State {
            paths: HashMap::from([(INodeNo::ROOT.0, backing.to_path_buf())]),
            next_ino: 2,
            files: HashMap::new(),
            next_fh: 1,
            volatile,
            cached: HashMap::new(),
            no_direct_io: false,
        }));
        let fs = EioFs {
            fault: fault.clone(),
            power: power.clone(),
            state: state.clone(),
        };
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName("hoox-eiofs".into()),
            MountOption::DefaultPermissions,
        ];
        config.acl = fuser::SessionACL::All;
        let session = fuser::spawn_mount(fs, mountpoint, &config).expect("mount the FUSE disk");
        EioMount {
            mountpoint: mountpoint.to_path_buf(),
            fault,
            power,
            state,
            session: Some(session),
        }
    }

    pub fn fail(&self, fault: Fault) {
        self.fault.store(fault as u8, Ordering::SeqCst);
    }

    /// Opens with O_DIRECT fail with EINVAL from now on, as on a file system without
    /// direct I/O: a writer must sync through the page cache (fdatasync) instead.
    pub fn refuse_direct_io(&self) {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .no_direct_io = true;
    }

    /// In a volatile mount, every sync from now on takes `delay` before it reaches the
    /// disk (none by default): long enough for a writer that answered before its sync to
    /// be caught with the sync still on its way ([`EioMount::freeze`]).
    pub fn delay_syncs(&self, delay: Duration) {
        self.power
            .sync_delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// The power goes now: nothing more reaches the disk, a sync under way included; writes
    /// and syncs still answer, as a kernel's would until it noticed. [`EioMount::power_cut`]
    /// then drops what the cache held, and brings the power back.
    pub fn freeze(&self) {
        self.power.frozen.store(true, Ordering::SeqCst);
    }

    /// While `hold`, every read waits, as on a hung network mount: its reader sits in
    /// read(2) until the hold ends (or 30 s pass).
    pub fn hold_reads(&self, hold: bool) {
        self.power.reads_held.store(hold, Ordering::SeqCst);
    }

    /// How many O_DSYNC writes a volatile mount has taken (the journal's direct I/O).
    pub fn dsync_writes(&self) -> u64 {
        self.power.dsync_writes.load(Ordering::SeqCst)
    }

    /// How many folder syncs (fsync of a directory) the mount has taken: a name created or
    /// linked survives a power cut only once its folder is synced, which this mount does
    /// not model, so a test counts them instead.
    pub fn dir_syncs(&self) -> u64 {
        self.power.dir_syncs.load(Ordering::SeqCst)
    }

    /// Loses every write not yet synced, as a power cut loses a disk's write cache; the
    /// backing files keep what was synced. Call it with no process using the mount: the
    /// kernel's own cached pages of those files are dropped too, or a reader after the
    /// "reboot" would still see the lost writes.
    pub fn power_cut(&self) {
        self.power.frozen.store(false, Ordering::SeqCst);
        self.power.sync_delay_ms.store(0, Ordering::SeqCst);
        let lost: Vec<u64> = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            st.cached.drain().map(|(ino, _)| ino).collect()
        };
        if let Some(s) = &self.session {
            let n = s.notifier();
            for ino in lost {
                // ENOENT: the kernel holds nothing of that inode, so nothing to drop.
                let _ = n.inval_inode(INodeNo(ino), 0, 0);
            }
        }
    }
}

impl Drop for EioMount {
    fn drop(&mut self) {
        // A read held would hold the unmount too.
        self.hold_reads(false);
        if let Some(s) = self.session.take()
            && let Err(e) = s.umount_and_join()
        {
            // Busy (a file still open): detach it, so no mount outlives the test.
            eprintln!(
                "eiofs: unmount failed ({e}); detaching {}",
                self.mountpoint.display()
            );
            let path = std::ffi::CString::new(self.mountpoint.as_os_str().as_encoded_bytes());
            if let Ok(p) = path {
                // SAFETY: a valid NUL-terminated path; MNT_DETACH takes no other argument.
                unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) };
            }
        }
    }
}

struct State {
    /// inode -> path in the backing directory
    paths: HashMap<u64, PathBuf>,
    next_ino: u64,
    files: HashMap<u64, File>,
    next_fh: u64,
    /// Whether writes wait in `cached` for a sync ([`EioMount::new_volatile`]).
    volatile: bool,
    /// inode -> its writes not yet synced, in a volatile mount.
    cached: HashMap<u64, Cached>,
    /// Opens with O_DIRECT fail with EINVAL ([`EioMount::refuse_direct_io`]).
    no_direct_io: bool,
}

/// A file's writes since its last sync, as the disk's cache holds them.
struct Cached {
    /// The file's size as written.
    size: u64,
    /// The backing file's bytes from here on are gone: a truncate below them since the
    /// last sync. Reads see zeros there, unless a later write covers them.
    cut: u64,
    /// (offset, bytes), oldest first: a later write wins where they overlap. A truncate
    /// clips them, so none reaches past `size`.
    writes: Vec<(u64, Vec<u8>)>,
}

impl Cached {
    fn truncate(&mut self, len: u64) {
        self.size = len;
        self.cut = self.cut.min(len);
        self.writes.retain_mut(|(at, d)| {
            d.truncate(len.saturating_sub(*at) as usize);
            !d.is_empty()
        });
    }

    /// `buf` (the backing file's bytes from `offset`, zeros past its end) as the file
    /// reads with the cached writes; cut to the file's size.
    fn overlay(&self, offset: u64, buf: &mut Vec<u8>) {
        buf.truncate(self.size.saturating_sub(offset) as usize);
        let end = offset + buf.len() as u64;
        if self.cut < end {
            buf[self.cut.saturating_sub(offset) as usize..].fill(0);
        }
        for (at, d) in &self.writes {
            let (from, to) = ((*at).max(offset), (at + d.len() as u64).min(end));
            if from < to {
                buf[(from - offset) as usize..(to - offset) as usize]
                    .copy_from_slice(&d[(from - at) as usize..(to - at) as usize]);
            }
        }
    }

    /// Writes it all to `path`, the backing file: what a sync puts on the disk.
    fn apply(self, path: &Path) -> std::io::Result<File> {
        let f = OpenOptions::new().write(true).open(path)?;
        if self.cut < f.metadata()?.len() {
            f.set_len(self.cut)?;
        }
        for (at, d) in &self.writes {
            f.write_all_at(d, *at)?;
        }
        f.set_len(self.size)?;
        Ok(f)
    }
}

impl State {
    fn path(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        self.paths.get(&ino.0).cloned().ok_or(Errno::ENOENT)
    }

    /// The inode of a backing path, numbering it on first sight.
    fn ino(&mut self, path: &Path) -> u64 {
        if let Some((&i, _)) = self.paths.iter().find(|(_, p)| p.as_path() == path) {
            return i;
        }
        let i = self.next_ino;
        self.next_ino += 1;
        self.paths.insert(i, path.to_path_buf());
        i
    }

    fn forget_path(&mut self, path: &Path) {
        let cached = &mut self.cached;
        self.paths.retain(|ino, p| {
            let keep = p.as_path() != path;
            if !keep {
                cached.remove(ino);
            }
            keep
        });
    }

    /// The write cache of `ino`, begun at the backing file's state if empty.
    fn cache(&mut self, ino: INodeNo) -> Result<&mut Cached, Errno> {
        if !self.cached.contains_key(&ino.0) {
            let size = std::fs::metadata(self.path(ino)?).map_err(errno)?.len();
            let c = Cached {
                size,
                cut: size,
                writes: Vec::new(),
            };
            self.cached.insert(ino.0, c);
        }
        Ok(self.cached.get_mut(&ino.0).expect("just inserted"))
    }

    /// `a` with the size the cached writes give the file.
    fn sized(&self, mut a: FileAttr) -> FileAttr {
        if let Some(c) = self.cached.get(&a.ino.0) {
            a.size = c.size;
        }
        a
    }

    /// Puts the cached writes of `ino` on the disk, then syncs them.
    fn sync_cached(&mut self, ino: INodeNo, datasync: bool) -> Result<(), Errno> {
        let Some(c) = self.cached.remove(&ino.0) else {
            return Ok(());
        };
        let f = c.apply(&self.path(ino)?).map_err(errno)?;
        if datasync {
            f.sync_data()
        } else {
            f.sync_all()
        }
        .map_err(errno)
    }

    fn file(&self, fh: FileHandle) -> Result<&File, Errno> {
        self.files.get(&fh.0).ok_or(Errno::EBADF)
    }
}

struct EioFs {
    fault: Arc<AtomicU8>,
    power: Arc<Power>,
    state: Arc<Mutex<State>>,
}

/// A volatile mount's power: how long a sync takes, and whether the power has gone. Read
/// outside the state's lock, so that a sync waiting out its delay does not hold up
/// [`EioMount::freeze`].
#[derive(Default)]
struct Power {
    sync_delay_ms: AtomicU64,
    frozen: AtomicBool,
    /// O_DSYNC writes seen: a test tells the journal's two ways of syncing apart by it.
    dsync_writes: AtomicU64,
    /// Folder syncs (fsync of a directory) seen.
    dir_syncs: AtomicU64,
    /// Reads wait while set ([`EioMount::hold_reads`]).
    reads_held: AtomicBool,
}

impl Power {
    /// Waits out the sync delay; then whether the sync may reach the disk.
    fn sync_lands(&self) -> bool {
        let ms = self.sync_delay_ms.load(Ordering::SeqCst);
        if ms > 0 {
            std::thread::sleep(Duration::from_millis(ms));
        }
        !self.frozen.load(Ordering::SeqCst)
    }
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    UNIX_EPOCH + Duration::new(secs.max(0) as u64, nsecs.clamp(0, 999_999_999) as u32)
}

fn attr(ino: u64, m: &Metadata) -> FileAttr {
    let kind = if m.is_dir() {
        FileType::Directory
    } else if m.file_type().is_symlink() {
        FileType::Symlink
    } else {
        FileType::RegularFile
    };
    FileAttr {
        ino: INodeNo(ino),
        size: m.len(),
        blocks: m.blocks(),
        atime: time(m.atime(), m.atime_nsec()),
        mtime: time(m.mtime(), m.mtime_nsec()),
        ctime: time(m.ctime(), m.ctime_nsec()),
        crtime: UNIX_EPOCH,
        kind,
        perm: (m.mode() & 0o7777) as u16,
        nlink: m.nlink() as u32,
        uid: m.uid(),
        gid: m.gid(),
        rdev: m.rdev() as u32,
        blksize: 4096,
        flags: 0,
    }
}

fn errno(e: std::io::Error) -> Errno {
    Errno::from(e)
}

/// The flags to open the backing file with: the caller's access mode and O_APPEND; not
/// O_DIRECT (the kernel hands us unaligned buffers) nor O_DSYNC (the kernel asks us to sync
/// after each such write, and that sync is where the fault strikes).
fn backing_options(flags: i32) -> OpenOptions {
    let mut o = OpenOptions::new();
    match flags & libc::O_ACCMODE {
        libc::O_WRONLY => o.write(true),
        libc::O_RDWR => o.read(true).write(true),
        _ => o.read(true),
    };
    if flags & libc::O_APPEND != 0 {
        o.append(true);
    }
    o
}

impl EioFs {
    fn fault(&self) -> Fault {
        match self.fault.load(Ordering::SeqCst) {
            1 => Fault::WritesAndSyncs,
            2 => Fault::Syncs,
            3 => Fault::JournalWrites,
            4 => Fault::ReadOnly,
            _ => Fault::None,
        }
    }

    /// The error the fault fails this write (or, if `!write`, this sync) of `ino` with.
    fn strikes(&self, st: &State, ino: INodeNo, write: bool) -> Option<Errno> {
        let eio = match self.fault() {
            Fault::None => false,
            Fault::WritesAndSyncs => true,
            Fault::Syncs => !write,
            Fault::JournalWrites => st
                .path(ino)
                .is_ok_and(|p| p.to_string_lossy().ends_with("-journal")),
            Fault::ReadOnly => return Some(Errno::EROFS),
        };
        eio.then_some(Errno::EIO)
    }

    /// A change to the directory (create, unlink, rename): refused only when read-only.
    fn read_only(&self) -> Result<(), Errno> {
        match self.fault() {
            Fault::ReadOnly => Err(Errno::EROFS),
            _ => Ok(()),
        }
    }

    /// A sync of `ino`, unless the fault strikes it.
    fn sync(
        &self,
        ino: INodeNo,
        reply: ReplyEmpty,
        sync: impl FnOnce(&mut State) -> Result<(), Errno>,
    ) {
        let mut st = self.state();
        match self
            .strikes(&st, ino, false)
            .map_or_else(|| sync(&mut st), Err)
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn entry_of(&self, path: &Path) -> Result<FileAttr, Errno> {
        let m = std::fs::symlink_metadata(path).map_err(errno)?;
        let mut st = self.state();
        let ino = st.ino(path);
        Ok(st.sized(attr(ino, &m)))
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
        Ok(self.state().path(parent)?.join(name))
    }
}

impl Filesystem for EioFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.child(parent, name).and_then(|p| self.entry_of(&p)) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let path = self.state().path(ino);
        match path.and_then(|p| std::fs::symlink_metadata(&p).map_err(errno)) {
            Ok(m) => reply.attr(&TTL, &self.state().sized(attr(ino.0, &m))),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let r = (|| {
            let path = self.state().path(ino)?;
            if let Some(len) = size {
                let mut st = self.state();
                if let Some(e) = self.strikes(&st, ino, true) {
                    return Err(e);
                }
                if st.volatile {
                    st.cache(ino)?.truncate(len);
                } else {
                    OpenOptions::new()
                        .write(true)
                        .open(&path)
                        .and_then(|f| f.set_len(len))
                        .map_err(errno)?;
                }
            }
            if let Some(mode) = mode {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                    .map_err(errno)?;
            }
            std::fs::symlink_metadata(&path).map_err(errno)
        })();
        match r {
            Ok(m) => reply.attr(&TTL, &self.state().sized(attr(ino.0, &m))),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let r = self.child(parent, name).and_then(|p| {
            self.read_only()?;
            std::fs::create_dir(&p).map_err(errno)?;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).map_err(errno)?;
            self.entry_of(&p)
        });
        match r {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.child(parent, name).and_then(|p| {
            self.read_only()?;
            std::fs::remove_file(&p).map_err(errno)?;
            self.state().forget_path(&p);
            Ok(())
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let r = (|| {
            self.read_only()?;
            let from = self.child(parent, name)?;
            let to = self.child(newparent, newname)?;
            std::fs::rename(&from, &to).map_err(errno)?;
            let mut st = self.state();
            st.forget_path(&to);
            for p in st.paths.values_mut() {
                if *p == from {
                    *p = to.clone();
                }
            }
            Ok(())
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let r = (|| {
            if flags.0 & libc::O_ACCMODE != libc::O_RDONLY {
                self.read_only()?;
            }
            if flags.0 & libc::O_DIRECT != 0 && self.state().no_direct_io {
                return Err(Errno::EINVAL);
            }
            let path = self.state().path(ino)?;
            let file = backing_options(flags.0).open(path).map_err(errno)?;
            let mut st = self.state();
            let fh = st.next_fh;
            st.next_fh += 1;
            st.files.insert(fh, file);
            Ok(fh)
        })();
        match r {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let r = (|| {
            self.read_only()?;
            let path = self.child(parent, name)?;
            let mut o = backing_options(flags);
            o.create(true).mode(mode);
            if flags & libc::O_EXCL != 0 {
                o.create_new(true);
            }
            if flags & libc::O_TRUNC != 0 {
                o.truncate(true);
            }
            let file = o.open(&path).map_err(errno)?;
            // A new file: nothing cached of an earlier one under its name.
            let mut st = self.state();
            let ino = st.ino(&path);
            st.cached.remove(&ino);
            drop(st);
            let a = self.entry_of(&path)?;
            let mut st = self.state();
            let fh = st.next_fh;
            st.next_fh += 1;
            st.files.insert(fh, file);
            Ok((a, fh))
        })();
        match r {
            Ok((a, fh)) => {
                reply.created(&TTL, &a, Generation(0), FileHandle(fh), FopenFlags::empty())
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        // At most 30 s: a test that failed while it held reads drops its gateway first,
        // which waits for the gateway's exit, which waits for this read.
        let until = std::time::Instant::now() + Duration::from_secs(30);
        while self.power.reads_held.load(Ordering::SeqCst) && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        let st = self.state();
        let r = st.file(fh).and_then(|f| {
            let mut buf = vec![0u8; size as usize];
            let mut done = 0;
            while done < buf.len() {
                match f.read_at(&mut buf[done..], offset + done as u64) {
                    Ok(0) => break,
                    Ok(n) => done += n,
                    Err(e) => return Err(errno(e)),
                }
            }
            match st.cached.get(&ino.0) {
                Some(c) => c.overlay(offset, &mut buf),
                None => buf.truncate(done),
            }
            Ok(buf)
        });
        match r {
            Ok(b) => reply.data(&b),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut st = self.state();
        if let Some(e) = self.strikes(&st, ino, true) {
            return reply.error(e);
        }
        if st.volatile {
            if self.power.frozen.load(Ordering::SeqCst) {
                return reply.written(data.len() as u32);
            }
            let r = st.cache(ino).map(|c| {
                c.size = c.size.max(offset + data.len() as u64);
                c.writes.push((offset, data.to_vec()));
            });
            // An O_DSYNC write returns once on the disk, as a disk's FUA write does.
            let r = r.and_then(|()| match flags.0 & libc::O_DSYNC {
                0 => Ok(()),
                _ => {
                    self.power.dsync_writes.fetch_add(1, Ordering::SeqCst);
                    drop(st);
                    let lands = self.power.sync_lands();
                    st = self.state();
                    match self.strikes(&st, ino, false) {
                        Some(e) => Err(e),
                        None if lands => st.sync_cached(ino, true),
                        None => Ok(()),
                    }
                }
            });
            return match r {
                Ok(()) => reply.written(data.len() as u32),
                Err(e) => reply.error(e),
            };
        }
        match st
            .file(fh)
            .and_then(|f| f.write_all_at(data, offset).map_err(errno))
        {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.state().files.remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        // The lock is not held while the sync waits out its delay.
        let volatile = self.state().volatile;
        let lands = !volatile || self.power.sync_lands();
        self.sync(ino, reply, |st| {
            if st.volatile {
                return if lands {
                    st.sync_cached(ino, datasync)
                } else {
                    Ok(())
                };
            }
            let f = st.file(fh)?;
            if datasync {
                f.sync_data()
            } else {
                f.sync_all()
            }
            .map_err(errno)
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = (|| {
            let dir = self.state().path(ino)?;
            let mut entries = vec![
                (ino.0, FileType::Directory, ".".into()),
                (ino.0, FileType::Directory, "..".into()),
            ];
            for e in std::fs::read_dir(&dir).map_err(errno)? {
                let e = e.map_err(errno)?;
                let kind = if e.file_type().map_err(errno)?.is_dir() {
                    FileType::Directory
                } else {
                    FileType::RegularFile
                };
                let i = self.state().ino(&e.path());
                entries.push((i, kind, e.file_name()));
            }
            Ok(entries)
        })();
        match r {
            Ok(entries) => {
                for (n, (i, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
                    if reply.add(INodeNo(i), n as u64 + 1, kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.power.dir_syncs.fetch_add(1, Ordering::SeqCst);
        self.sync(ino, reply, |st| {
            File::open(st.path(ino)?)
                .and_then(|d| d.sync_all())
                .map_err(errno)
        });
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // Plenty of room, as the backing disk has: the fault is EIO, not ENOSPC.
        reply.statfs(1 << 24, 1 << 23, 1 << 23, 1 << 20, 1 << 19, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }
}
