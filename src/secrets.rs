//! Secret files, and the files that vouch for others: the secrets of the auth methods, the
//! TLS key, the client CA, the executor's CA. Each is read once it is known that no other
//! user of this machine can read a secret, nor put a file of their own in its place (the
//! file's mode, and every folder on the way to it as the kernel resolves it); under
//! systemd a bare name may come from `$CREDENTIALS_DIRECTORY`. What a secret is read as,
//! and whom it names, is here too; how it is compared is `gateway::auth`'s.

use std::fmt;
use std::io::Read;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use crate::gateway::auth::identity_char;

/// A secrets file is a handful of lines; anything bigger is a mistake, not a secret.
const MAX_SECRETS_FILE: u64 = 1 << 20;

/// A credential. It can be compared, never shown.
#[derive(Clone)]
pub struct Secret {
    bytes: Box<[u8]>,
    /// The client it names (`@NAME SECRET` in a secrets file): its keys are the namespace
    /// `psk.NAME`. None: the one shared client `psk`.
    client: Option<Box<str>>,
}

/// The longest client name on a secrets line: `psk.` and it fit an identity's 64 characters.
pub const MAX_CLIENT_NAME: usize = 60;

impl Secret {
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Secret {
            bytes: bytes.into().into_boxed_slice(),
            client: None,
        }
    }

    /// A secret that names its client.
    pub fn of_client(client: &str, bytes: impl Into<Vec<u8>>) -> Self {
        Secret {
            client: Some(client.into()),
            ..Secret::new(bytes)
        }
    }

    pub fn expose(&self) -> &[u8] {
        &self.bytes
    }

    pub fn client(&self) -> Option<&str> {
        self.client.as_deref()
    }

    /// One line of a secrets file, trimmed, neither blank nor a comment: `SECRET`, or
    /// `@NAME SECRET`. The error names what is wrong, never the line's text.
    pub(crate) fn parse_line(line: &[u8]) -> Result<Secret, &'static str> {
        let Some(rest) = line.strip_prefix(b"@") else {
            return Ok(Secret::new(line));
        };
        let cut = rest.iter().position(u8::is_ascii_whitespace);
        let (name, secret) = match cut {
            Some(i) => (&rest[..i], rest[i..].trim_ascii()),
            None => (rest, &b""[..]),
        };
        let fits = |b: &u8| identity_char(char::from(*b));
        if name.is_empty() || name.len() > MAX_CLIENT_NAME || !name.iter().all(fits) {
            return Err(
                "a line starting with @ names a client: @NAME SECRET, NAME 1 to 60 \
                        of A-Z a-z 0-9 . _ -",
            );
        }
        if secret.is_empty() {
            return Err("a client's line has no secret after its name: @NAME SECRET");
        }
        // `fits` holds only ASCII.
        let name = std::str::from_utf8(name).unwrap_or_default();
        Ok(Secret::of_client(name, secret))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("cannot read secrets file {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    // Said of the TLS key too, so "a secret", not "secrets file".
    #[error("{} holds a secret and is readable by everyone (mode {mode:o}); run chmod o-rwx on it", .path.display())]
    WorldReadable { path: PathBuf, mode: u32 },
    #[error("{} holds a secret and is writable by everyone (mode {mode:o}): any user of this machine could put one of their own there; run chmod o-rwx on it", .path.display())]
    WorldWritable { path: PathBuf, mode: u32 },
    #[error("{} holds a secret, and {}", .path.display(), .how)]
    OpenFolder { path: PathBuf, how: Exposed },
    /// A folder, or a FIFO, a socket, a device (a read of one may never end): `not_a_file`.
    #[error("{} {why}", .path.display())]
    NotAFile { path: PathBuf, why: &'static str },
    #[error("secrets file {} holds no secret", .path.display())]
    Empty { path: PathBuf },
    #[error("secrets file {} is larger than 1 MiB", .path.display())]
    TooLarge { path: PathBuf },
    #[error("secrets file {}, line {line}: {why}", .path.display())]
    Line {
        path: PathBuf,
        line: usize,
        why: &'static str,
    },
}

/// Reads one secret per line; blank lines and `#` comments are skipped, whitespace around
/// a secret is not part of it. The mode is checked on the open file, so the file we
/// checked is the file we read.
pub fn load_secrets(path: &Path) -> Result<Vec<Secret>, SecretError> {
    let io = |source| SecretError::Io {
        path: path.to_owned(),
        source,
    };
    let file = open_unblocked(path).map_err(io)?;
    private(path, &file.metadata().map_err(io)?)?;
    let mut text = Vec::new();
    file.take(MAX_SECRETS_FILE + 1)
        .read_to_end(&mut text)
        .map_err(io)?;
    if text.len() as u64 > MAX_SECRETS_FILE {
        return Err(SecretError::TooLarge {
            path: path.to_owned(),
        });
    }
    // An editor's encoding, read as bytes, made secrets anyone could send: a UTF-16 file
    // (PowerShell 5's `>`) split into lines of a NUL each, a UTF-8 byte order mark became
    // a secret of its own (a file "empty" but for it), or the start of one or of a
    // comment. The mark is dropped; UTF-16 (its mark, or a NUL in a line), and a CR inside
    // a line (lines ended as on a classic Mac: the file read as one secret) are refused.
    // Other control bytes stay part of a secret, as before 0.2.28 (a key of raw bytes).
    let text = text.strip_prefix("\u{feff}".as_bytes()).unwrap_or(&text);
    let bad_at = |line, why| SecretError::Line {
        path: path.to_owned(),
        line,
        why,
    };
    if text.starts_with(&[0xff, 0xfe]) || text.starts_with(&[0xfe, 0xff]) {
        return Err(bad_at(
            1,
            "the file is saved as UTF-16 (its first bytes say so): save it as UTF-8",
        ));
    }
    let mut secrets: Vec<Secret> = Vec::new();
    for (n, line) in text.split(|&b| b == b'\n').enumerate() {
        let line = line.trim_ascii();
        if line.is_empty() || line.starts_with(b"#") {
            continue;
        }
        let bad = |why| bad_at(n + 1, why);
        if line.contains(&0) {
            return Err(bad(
                "a NUL byte: is the file saved as UTF-16? Save it as UTF-8",
            ));
        }
        if line.contains(&b'\r') {
            return Err(bad(
                "a CR inside a line: are its lines ended as on a classic Mac? End each \
                 with a line feed",
            ));
        }
        let secret = Secret::parse_line(line).map_err(bad)?;
        // One secret naming two clients: which namespace a request falls in would depend
        // on the order of the lines.
        if secrets
            .iter()
            .any(|s| s.expose() == secret.expose() && s.client() != secret.client())
        {
            return Err(bad(
                "this secret is also on another line, for another client",
            ));
        }
        secrets.push(secret);
    }
    if secrets.is_empty() {
        return Err(SecretError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(secrets)
}

/// Opens `path` to read without waiting: opening a FIFO to read otherwise waits for a
/// writer, for ever if none comes (and a reload waiting so took no other SIGHUP). A regular
/// file ignores the flag; the caller refuses anything else, unread.
fn open_unblocked(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

/// Why what `meta` describes is no file to read, if it is not one: a folder, or what is
/// not a regular file (a FIFO, a device), whose read may never end.
fn not_a_file(meta: &std::fs::Metadata) -> Option<&'static str> {
    if meta.is_dir() {
        Some("is a folder, not a file (an empty path names the config's folder)")
    } else if !meta.is_file() {
        Some("is not a regular file")
    } else {
        None
    }
}

/// The whole of a file the config names (itself, a certificate, a CA bundle), refusing at
/// once a folder or what is not a regular file (a FIFO, a device), whose read may never end.
pub fn read_regular(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut file = open_unblocked(path)?;
    if let Some(why) = not_a_file(&file.metadata()?) {
        return Err(std::io::Error::other(why));
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Refuses a secret file (a secrets list, a TLS key) that everyone may read, or write.
pub fn refuse_world_readable(path: &Path) -> Result<(), SecretError> {
    let meta = std::fs::metadata(path).map_err(|source| SecretError::Io {
        path: path.to_owned(),
        source,
    })?;
    private(path, &meta)
}

/// Why a file that vouches for others (a CA bundle: `server.client_ca`, `executor.ca_file`)
/// cannot be trusted, if it cannot: one anyone on the machine may write lets them add a CA
/// of their own, and with it a client of their own (or an executor). Readable is fine: it
/// holds no secret. A file that cannot be looked at is for its reader to report.
/// `what` is what they could add: `a CA`, or `settings` for the config file, which names
/// the CAs, the secrets and the executor (refusing those open to writes would be moot if
/// the file naming them were not).
pub fn open_to_writes(path: &Path, what: &str) -> Option<String> {
    let mode = std::fs::metadata(path).ok()?.permissions().mode();
    if mode & 0o002 != 0 {
        return Some(format!(
            "writable by everyone (mode {:o}): any user of this machine could add {what} of \
             their own; run chmod o-w on it",
            mode & 0o7777
        ));
    }
    folder_open_to_others(path, what)
}

/// Why `path` (a CA bundle, or the admin socket this gateway makes) could be replaced by
/// anyone, with `what` of their own: a folder on its way that everyone may write, without
/// the sticky bit ([`open_folder`]).
pub fn folder_open_to_others(path: &Path, what: &str) -> Option<String> {
    Some(match open_folder(path)? {
        Exposed::Open { dir, mode } => format!(
            "in {}, which is writable by everyone (mode {mode:o}): any user of this \
             machine could put {what} of their own in its place; run chmod o-w on {}, or \
             choose another folder",
            dir.display(),
            dir.display()
        ),
        theirs @ Exposed::Theirs { .. } => theirs.said(what),
    })
}

/// How another user could put a file of their own in the place of a path: [`open_folder`].
#[derive(Debug, PartialEq)]
pub enum Exposed {
    /// A folder on its way that everyone may write, without the sticky bit.
    Open { dir: PathBuf, mode: u32 },
    /// A name on its way (a link, or the file) in a folder that everyone may write, with
    /// the sticky bit, that another user owns: the sticky bit keeps others from renaming
    /// only what is not theirs.
    Theirs { name: PathBuf, uid: u32 },
}

impl Exposed {
    /// Who could put `what` of their own in the path's place, and the way out.
    fn said(&self, what: &str) -> String {
        match self {
            Exposed::Open { dir, mode } => format!(
                "{} is writable by everyone (mode {mode:o}): any user of this machine could \
                 put {what} of their own in its place; run chmod o-w on {}",
                dir.display(),
                dir.display()
            ),
            Exposed::Theirs { name, uid } => format!(
                "{} belongs to another user (uid {uid}) in a folder everyone may write: the \
                 sticky bit keeps others from replacing only what is not theirs, so that \
                 user could put {what} of their own in its place; use a folder of its own, \
                 or make it root's or the user's that runs this (chown)",
                name.display()
            ),
        }
    }
}

impl fmt::Display for Exposed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.said("a file"))
    }
}

/// A folder on the way to `path` that everyone may write and that lacks the sticky bit
/// (which, as on /tmp, keeps others from renaming what is not theirs): there, anyone could
/// put a file of their own in the place of `path`, or of a link on the way to it, whatever
/// the file's own mode. With the sticky bit, the owner of a name in it still may, so each
/// name there (a link on the way, the file) must be root's or this process's user's. The
/// path is walked as the kernel resolves it: every folder a name is looked up in,
/// following each link from where it points (`..` included), so a folder only named on
/// the way (`open/../private`) is not one the file depends on.
fn open_folder(path: &Path) -> Option<Exposed> {
    use std::collections::VecDeque;
    use std::path::Component;
    let mut left: VecDeque<_> = std::path::absolute(path)
        .ok()?
        .components()
        .map(|c| c.as_os_str().to_owned())
        .collect();
    let mut at = PathBuf::new();
    // As the kernel's own bound on the links one lookup follows (ELOOP).
    let mut links = 0;
    while let Some(part) = left.pop_front() {
        match Path::new(&part).components().next() {
            Some(Component::RootDir) => at = PathBuf::from("/"),
            Some(Component::ParentDir) => {
                at.pop();
            }
            Some(Component::Normal(name)) => {
                // `name` is looked up in `at`: whoever may write `at` may replace it.
                let mode = std::fs::metadata(&at).ok()?.permissions().mode();
                let next = at.join(name);
                if mode & 0o002 != 0 && mode & 0o1000 == 0 {
                    let mode = mode & 0o7777;
                    return Some(Exposed::Open { dir: at, mode });
                }
                if mode & 0o002 != 0 {
                    use std::os::unix::fs::MetadataExt;
                    // SAFETY: geteuid cannot fail and touches no memory.
                    let me = unsafe { libc::geteuid() };
                    let uid = std::fs::symlink_metadata(&next).map_or(0, |m| m.uid());
                    if uid != 0 && uid != me {
                        return Some(Exposed::Theirs { name: next, uid });
                    }
                }
                match std::fs::read_link(&next) {
                    Ok(target) => {
                        links += 1;
                        if links > 40 {
                            return None;
                        }
                        // Relative to the folder the link is in, which `at` stays.
                        for c in target.components().rev() {
                            left.push_front(c.as_os_str().to_owned());
                        }
                    }
                    Err(_) => at = next,
                }
            }
            _ => {}
        }
    }
    None
}

/// A file others may read gives its secrets away; one others may write lets anyone on the
/// machine append a secret (or swap a key) of their own, read at the next start or reload.
/// Group bits are the operator's choice: the service's group may need to read.
fn private(path: &Path, meta: &std::fs::Metadata) -> Result<(), SecretError> {
    // Before its mode: a folder's usual 0755 would read as "readable by everyone", and the
    // chmod that suggests leaves it a folder.
    if let Some(why) = not_a_file(meta) {
        return Err(SecretError::NotAFile {
            path: path.to_owned(),
            why,
        });
    }
    let mode = meta.permissions().mode();
    let (path, shown) = (path.to_owned(), mode & 0o7777);
    if mode & 0o004 != 0 {
        return Err(SecretError::WorldReadable { path, mode: shown });
    }
    if mode & 0o002 != 0 {
        return Err(SecretError::WorldWritable { path, mode: shown });
    }
    match open_folder(&path) {
        Some(how) => Err(SecretError::OpenFolder { path, how }),
        None => Ok(()),
    }
}

/// Where to read a configured secrets file, honouring systemd credentials
/// (`LoadCredential=` / `SetCredential=`, exposed under `$CREDENTIALS_DIRECTORY`).
///
/// The rule: a configured path that is a bare file name (`hmac`, no directory part) is
/// looked up in `$CREDENTIALS_DIRECTORY` first, and used from there if it exists. Any
/// other path, and a bare name with no such credential, is returned unchanged (a relative
/// path is then resolved against the config file by the caller). Credential names cannot
/// contain `/`, so nothing else could name a credential, and `..` can never escape.
pub fn credential_path(configured: &Path) -> PathBuf {
    let dir = std::env::var_os("CREDENTIALS_DIRECTORY");
    credential_path_in(configured, dir.as_deref().map(Path::new))
}

/// [`credential_path`] with the credentials directory given, for tests.
pub fn credential_path_in(configured: &Path, creds_dir: Option<&Path>) -> PathBuf {
    let mut parts = configured.components();
    let bare = matches!(
        (parts.next(), parts.next()),
        (Some(Component::Normal(_)), None)
    );
    if let Some(dir) = creds_dir.filter(|d| bare && !d.as_os_str().is_empty()) {
        let candidate = dir.join(configured);
        if candidate.is_file() {
            return candidate;
        }
    }
    configured.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn load_secrets_reads_lines() {
        let d = tempfile::tempdir().unwrap();
        let p = write(
            d.path(),
            "keys",
            "# rotation: new first\n  new-key  \n\n\told-key\r\n# done\n",
            0o600,
        );
        let s = load_secrets(&p).unwrap();
        let got: Vec<&[u8]> = s.iter().map(Secret::expose).collect();
        assert_eq!(got, vec![&b"new-key"[..], b"old-key"]);
    }

    /// What an editor's encoding puts in a file is no secret: a UTF-8 byte order mark is
    /// dropped (a file empty but for it holds none; one before a comment leaves it a
    /// comment, before a secret leaves it that secret), and a UTF-16 file, or a control
    /// character in a line, is refused, naming the line, never its text. Each was a
    /// secret anyone could send: a NUL, the mark's three bytes, the comment's text.
    #[test]
    fn load_secrets_reads_text_as_an_editor_saved_it() {
        let d = tempfile::tempdir().unwrap();
        let at = |name: &str, bytes: &[u8]| {
            let p = d.path().join(name);
            std::fs::write(&p, bytes).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
            load_secrets(&p)
        };
        let bom = "\u{feff}";
        assert!(matches!(
            at("bom-only", format!("{bom}\n").as_bytes()),
            Err(SecretError::Empty { .. })
        ));
        assert!(matches!(
            at("bom-comment", format!("{bom}# desk A\n").as_bytes()),
            Err(SecretError::Empty { .. })
        ));
        let s = at("bom-secret", format!("{bom}real-secret\r\n").as_bytes()).unwrap();
        assert_eq!(s[0].expose(), b"real-secret");
        let s = at(
            "bom-client",
            format!("{bom}@desk-a real-secret\n").as_bytes(),
        )
        .unwrap();
        assert_eq!(s[0].client(), Some("desk-a"));
        // UTF-16 as PowerShell 5 and iconv write it, with its mark; and without one.
        let utf16 = |mark: &[u8], text: &str| {
            let mut b = mark.to_vec();
            b.extend(text.encode_utf16().flat_map(u16::to_le_bytes));
            b
        };
        for (name, bytes, line) in [
            ("utf16", utf16(&[0xff, 0xfe], "my-real-secret\r\n"), 1),
            ("utf16-bare", utf16(&[], "my-real-secret\r\n"), 1),
            ("mac", b"mac-one\rmac-two\n".to_vec(), 1),
            ("nul", b"# fine\nsec\0ret\n".to_vec(), 2),
        ] {
            let e = at(name, &bytes).unwrap_err();
            assert!(
                matches!(e, SecretError::Line { line: l, .. } if l == line),
                "{name}: {e}"
            );
            let msg = e.to_string();
            assert!(!msg.contains("real") && !msg.contains("mac-"), "{msg}");
        }
        // Other control bytes are part of a secret, as before (a key of raw bytes: a
        // secrets file that started the gateway must start the next version).
        let s = at("raw", b"raw\x1b\x7f\x01key\n").unwrap();
        assert_eq!(s[0].expose(), b"raw\x1b\x7f\x01key");
        // A tab is whitespace, inside a line too (`@NAME<TAB>SECRET`).
        let s = at("tab", b"@desk-b\tsecret-b\n").unwrap();
        assert_eq!(
            (s[0].client(), s[0].expose()),
            (Some("desk-b"), &b"secret-b"[..])
        );
    }

    /// A bad client line is an error naming the file and the line, never the text; one
    /// secret naming two clients is refused.
    #[test]
    fn load_secrets_names_a_bad_client_line() {
        let d = tempfile::tempdir().unwrap();
        let p = write(
            d.path(),
            "k",
            "# a\n@desk-a s3cret-a\n@desk:b s3cret-b\n",
            0o600,
        );
        let e = load_secrets(&p).unwrap_err().to_string();
        assert!(e.contains("line 3") && e.contains("@NAME SECRET"), "{e}");
        assert!(!e.contains("s3cret"), "{e}");
        let p = write(d.path(), "k2", "@desk-a same\n@desk-b same\n", 0o600);
        let e = load_secrets(&p).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("another client"), "{e}");
        let p = write(d.path(), "k3", "@desk-a one\n@desk-a two\nthree\n", 0o600);
        let clients: Vec<_> = load_secrets(&p)
            .unwrap()
            .iter()
            .map(|s| s.client().map(str::to_owned))
            .collect();
        assert_eq!(
            clients,
            [Some("desk-a".into()), Some("desk-a".into()), None]
        );
    }

    #[test]
    fn load_secrets_refuses_unsafe_or_empty_files() {
        let d = tempfile::tempdir().unwrap();
        let p = write(d.path(), "open", "topsecret\n", 0o644);
        let e = load_secrets(&p).unwrap_err();
        assert!(matches!(e, SecretError::WorldReadable { mode: 0o644, .. }));
        let msg = e.to_string();
        assert!(
            msg.contains(&p.display().to_string()) && !msg.contains("topsecret"),
            "{msg}"
        );

        let p = write(d.path(), "blank", "\n# only a comment\n   \n", 0o600);
        assert!(matches!(load_secrets(&p), Err(SecretError::Empty { .. })));

        // A folder is said to be one, whatever its mode: not "readable by everyone".
        let folder = d.path().join("folder");
        std::fs::create_dir(&folder).unwrap();
        std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o755)).unwrap();
        for e in [
            load_secrets(&folder),
            refuse_world_readable(&folder).map(|()| vec![]),
        ] {
            let e = e.unwrap_err();
            assert!(matches!(e, SecretError::NotAFile { .. }), "{e}");
            assert!(e.to_string().contains("is a folder, not a file"), "{e}");
        }

        // A FIFO no one writes to is refused at once, not read (for ever).
        let fifo = d.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        for e in [
            load_secrets(&fifo),
            refuse_world_readable(&fifo).map(|()| vec![]),
        ] {
            let e = e.unwrap_err();
            assert!(matches!(e, SecretError::NotAFile { .. }), "{e}");
        }
        // So is any file the config names (itself, a certificate, a CA bundle).
        let e = read_regular(&fifo).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let e = read_regular(&folder).unwrap_err();
        assert!(e.to_string().contains("is a folder"), "{e}");
        assert_eq!(read_regular(&p).unwrap(), b"\n# only a comment\n   \n");

        let missing = d.path().join("missing");
        let e = load_secrets(&missing).unwrap_err();
        assert!(matches!(e, SecretError::Io { .. }));
        assert!(e.to_string().contains("missing"));

        // The limit itself is allowed; a byte more is refused.
        let p = d.path().join("big");
        std::fs::write(&p, vec![b'a'; MAX_SECRETS_FILE as usize]).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(load_secrets(&p).unwrap().len(), 1);
        std::fs::write(&p, vec![b'a'; (MAX_SECRETS_FILE + 1) as usize]).unwrap();
        assert!(matches!(
            load_secrets(&p),
            Err(SecretError::TooLarge { .. })
        ));

        // Group-readable is the operator's choice (a service group may read it).
        let p = write(d.path(), "group", "s\n", 0o640);
        assert!(load_secrets(&p).is_ok());
    }

    /// A file in a folder anyone may write (without the sticky bit) is anyone's to replace,
    /// whatever its own mode: a secret, the TLS key, or a CA bundle there is refused, and so
    /// is one reached through a link in such a folder. A sticky folder (as /tmp) is not.
    #[test]
    fn a_file_in_a_folder_anyone_may_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let open = d.path().join("open");
        std::fs::create_dir(&open).unwrap();
        let mode = |m: u32| std::fs::set_permissions(&open, std::fs::Permissions::from_mode(m));
        mode(0o777).unwrap();
        let secret = write(&open, "secret", "topsecret\n", 0o600);
        let e = load_secrets(&secret).unwrap_err();
        assert!(
            matches!(&e, SecretError::OpenFolder { how: Exposed::Open { dir, mode: 0o777 }, .. } if *dir == open),
            "{e:?}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("chmod o-w on {}", open.display())),
            "{msg}"
        );
        assert!(matches!(
            refuse_world_readable(&secret),
            Err(SecretError::OpenFolder { .. })
        ));
        let ca = write(&open, "ca.pem", "", 0o644);
        let why = open_to_writes(&ca, "a CA").unwrap();
        assert!(
            why.starts_with(&format!(
                "in {}, which is writable by everyone",
                open.display()
            )),
            "{why}"
        );
        // Reached through a link in the open folder: the link is anyone's to change.
        let private = write(d.path(), "private", "topsecret\n", 0o600);
        let link = open.join("link");
        std::os::unix::fs::symlink(&private, &link).unwrap();
        assert!(load_secrets(&private).is_ok());
        assert!(matches!(
            load_secrets(&link),
            Err(SecretError::OpenFolder { .. })
        ));
        // Also when the link in the open folder is only on the way, behind another.
        let via = d.path().join("via");
        std::fs::create_dir(&via).unwrap();
        std::os::unix::fs::symlink(&link, via.join("link")).unwrap();
        assert!(matches!(
            load_secrets(&via.join("link")),
            Err(SecretError::OpenFolder { how: Exposed::Open { dir, .. }, .. }) if dir == open
        ));
        // A folder only named on the way is not one the file depends on.
        assert!(load_secrets(&open.join("..").join("private")).is_ok());
        // Sticky, as /tmp: others may not rename what is not theirs.
        mode(0o1777).unwrap();
        assert!(load_secrets(&secret).is_ok());
        assert_eq!(open_to_writes(&ca, "a CA"), None);
        mode(0o700).unwrap();
    }

    /// In a sticky folder that everyone may write (as /tmp), the sticky bit keeps others
    /// from renaming only what is not theirs: a link, or the file itself, that another
    /// user owns there is theirs to replace, with a secret (or a CA) of their own. Refused,
    /// naming it and its owner; ours (or root's) there is not. Run as root (CI), to chown.
    #[test]
    fn a_link_or_file_of_another_user_in_a_sticky_folder_is_refused() {
        use std::os::unix::fs::{PermissionsExt, lchown};
        const NOBODY: u32 = 65534;
        let d = tempfile::tempdir().unwrap();
        let sticky = d.path().join("sticky");
        std::fs::create_dir(&sticky).unwrap();
        std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let private = write(d.path(), "private", "topsecret\n", 0o600);
        let link = sticky.join("link");
        std::os::unix::fs::symlink(&private, &link).unwrap();
        let secret = write(&sticky, "secret", "topsecret\n", 0o600);
        let ca = write(&sticky, "ca.pem", "", 0o644);
        // Ours: as before.
        assert!(load_secrets(&link).is_ok());
        assert!(load_secrets(&secret).is_ok());
        assert_eq!(open_to_writes(&ca, "a CA"), None);
        for p in [&link, &secret, &ca] {
            lchown(p, Some(NOBODY), None).expect("this test needs root, to give files away");
        }
        for p in [&link, &secret] {
            let e = load_secrets(p).unwrap_err();
            assert!(
                matches!(&e, SecretError::OpenFolder { how: Exposed::Theirs { name, uid: NOBODY }, .. } if name == p),
                "{e:?}"
            );
            let msg = e.to_string();
            assert!(
                msg.contains(&format!(
                    "{} belongs to another user (uid 65534)",
                    p.display()
                )) && !msg.contains("topsecret"),
                "{msg}"
            );
            assert!(refuse_world_readable(p).is_err());
        }
        let why = open_to_writes(&ca, "a CA").unwrap();
        assert!(
            why.contains("belongs to another user") && why.contains("could put a CA of their own"),
            "{why}"
        );
        // Behind a link of ours, the file it names in the sticky folder counts too.
        let ours = d.path().join("ours");
        std::os::unix::fs::symlink(&secret, &ours).unwrap();
        assert!(load_secrets(&ours).is_err());
        // The folder's owner is not the question (only its mode is): not sticky, the folder
        // is refused as open to all, whoever owns what is in it.
        std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(
            load_secrets(&secret),
            Err(SecretError::OpenFolder {
                how: Exposed::Open { .. },
                ..
            })
        ));
        // Closed to others, another user's file there is the operator's doing (as the
        // service user's own secrets are to root's check-config).
        std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(load_secrets(&secret).is_ok());
        assert!(load_secrets(&link).is_ok());
    }

    /// A file anyone may write is anyone's to add a secret to: refused, named, with the
    /// remedy, whether or not others may also read it; the TLS key's check refuses it too.
    #[test]
    fn load_secrets_refuses_a_world_writable_file() {
        let d = tempfile::tempdir().unwrap();
        for mode in [0o602, 0o622, 0o642] {
            let p = write(d.path(), "open", "topsecret\n", mode);
            let e = load_secrets(&p).unwrap_err();
            assert!(
                matches!(&e, SecretError::WorldWritable { mode: m, .. } if *m == mode),
                "{mode:o}: {e:?}"
            );
            let msg = e.to_string();
            assert!(
                msg.contains(&p.display().to_string())
                    && msg.contains("writable by everyone")
                    && msg.contains("chmod o-rwx")
                    && !msg.contains("topsecret"),
                "{msg}"
            );
            assert!(matches!(
                refuse_world_readable(&p),
                Err(SecretError::WorldWritable { .. })
            ));
        }
        // Both at once: the first of the two is said; chmod o-rwx mends both.
        let p = write(d.path(), "both", "s\n", 0o606);
        assert!(matches!(
            load_secrets(&p),
            Err(SecretError::WorldReadable { .. })
        ));
        // The group may write (an operator's choice, as reading is).
        let p = write(d.path(), "group", "s\n", 0o660);
        assert!(load_secrets(&p).is_ok());
    }

    #[test]
    fn credentials_directory_rule() {
        let creds = tempfile::tempdir().unwrap();
        write(creds.path(), "hmac", "s\n", 0o400);
        let c = Some(creds.path());
        // A bare name present in the credentials directory comes from there.
        assert_eq!(
            credential_path_in(Path::new("hmac"), c),
            creds.path().join("hmac")
        );
        // A bare name that is not a credential, any path with a directory part, and
        // every path when no credentials directory is set: unchanged.
        for p in [
            "bearer",
            "/etc/hoox-edge/hmac",
            "secrets/hmac",
            "./hmac",
            "../hmac",
        ] {
            assert_eq!(credential_path_in(Path::new(p), c), PathBuf::from(p), "{p}");
        }
        assert_eq!(
            credential_path_in(Path::new("hmac"), None),
            PathBuf::from("hmac")
        );
        assert_eq!(
            credential_path_in(Path::new("hmac"), Some(Path::new(""))),
            PathBuf::from("hmac")
        );
    }
}
