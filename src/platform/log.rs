//! Logging: to the journal with structured fields under systemd, to stderr otherwise (SPEC §5).
//!
//! Callers use the `log` macros, with key-value fields for what an operator filters on:
//! `log::info!(key = key.as_str(), outcome = "committed"; "trade accepted")`. In the journal
//! each field becomes its own upper-cased journal field (`KEY=…`, `OUTCOME=…`, searchable with
//! `journalctl -u hoox-edge OUTCOME=committed`), and follows the message as `k=v` in its
//! text too, as on stderr: `journalctl -f` and `systemctl status` show only the text.
//!
//! **Rule for every caller: no secret is ever logged**: not an API key, HMAC secret, bearer
//! token, signature, private key, nor a request body (it may carry `apiKey`). Log the name of the
//! file a secret came from, never its content. This module cannot enforce that; review does.

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use log::kv::{Key, Value, VisitSource};
use log::{LevelFilter, Log, Metadata, Record};

/// Installs the process logger once; a second call keeps the first logger.
///
/// Under systemd (stderr is the journal stream, `$JOURNAL_STREAM` matches), records go to the
/// journal natively, so fields stay structured and priorities map to journal levels. Anywhere
/// else, one line per record on stderr.
pub fn init(level: LevelFilter) {
    let to: Box<dyn Log> = if systemd_journal_logger::connected_to_journal() {
        match systemd_journal_logger::JournalLog::new() {
            Ok(journal) => Box::new(Journal(journal)),
            // The journal socket can be absent even when stderr is a journal stream (a
            // container without /run/systemd/journal): stderr still reaches journald.
            Err(_) => Box::new(Stderr),
        }
    } else {
        Box::new(Stderr)
    };
    let installed = log::set_boxed_logger(Box::new(Filtered {
        inner: to,
        max: level,
    }));
    if installed.is_ok() {
        log::set_max_level(level);
    }
}

/// Whether a record is written. This crate's own go by the level `init` set (the `log`
/// macros check it before a record is made). Other crates' (rustls: a warning for each TLS
/// 1.2 renegotiation a client asks for, anyone's to send, ~1,000 lines a second from one
/// host) only at error, unless the level is debug or finer: unthrottled, they pushed the
/// audit trail out of journald's rate limit, which the gateway's own floods are kept from.
fn wanted(metadata: &Metadata, max: LevelFilter) -> bool {
    metadata.target().starts_with("hoox_edge")
        || metadata.level() <= log::Level::Error
        || max >= LevelFilter::Debug
}

/// The process logger: `inner` (the journal's or stderr's) given only what [`wanted`]
/// lets through at `max`, the level `init` was given.
struct Filtered<L> {
    inner: L,
    max: LevelFilter,
}

impl<L: Log> Log for Filtered<L> {
    fn enabled(&self, metadata: &Metadata) -> bool {
        wanted(metadata, self.max) && self.inner.enabled(metadata)
    }

    fn log(&self, record: &Record) {
        // The `log` macros do not ask `enabled`.
        if wanted(record.metadata(), self.max) {
            self.inner.log(record);
        }
    }

    fn flush(&self) {
        self.inner.flush();
    }
}

/// The journal's logger, with each record's fields in its message too: `webhook` alone
/// is what `journalctl -f` would show of every trade. Its inner logger is the journal's
/// own (a stand-in in tests).
struct Journal<L = systemd_journal_logger::JournalLog>(L);

impl<L: Log> Log for Journal<L> {
    fn enabled(&self, metadata: &Metadata) -> bool {
        self.0.enabled(metadata)
    }

    fn log(&self, record: &Record) {
        let text = journal_text(record);
        self.0.log(
            &Record::builder()
                .args(format_args!("{text}"))
                .level(record.level())
                .target(record.target())
                .module_path(record.module_path())
                .file(record.file())
                .line(record.line())
                .key_values(record.key_values())
                .build(),
        );
    }

    fn flush(&self) {
        self.0.flush();
    }
}

/// A record's `MESSAGE=`: its text and its fields, as on stderr without the time, level
/// and target (the journal has its own). Control characters escaped as on stderr: one in a
/// client certificate's name made `journalctl` and `systemctl status` show the whole
/// message as "[blob data]", the warning that cut that client off included.
fn journal_text(record: &Record) -> String {
    let mut text = record.args().to_string();
    let _ = record.key_values().visit(&mut Fields(&mut text));
    escape_controls(text)
}

/// The plain logger: `2026-11-30T04:50:00.123Z INFO hoox_edge::gateway: message k=v`.
struct Stderr;

impl Log for Stderr {
    fn enabled(&self, _: &Metadata) -> bool {
        // The filter is `Filtered`'s.
        true
    }

    fn log(&self, record: &Record) {
        let line = format_line(SystemTime::now(), record);
        // One write per record, so lines from concurrent threads do not interleave; a failed
        // write to stderr has nowhere better to be reported.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {
        let _ = std::io::stderr().flush();
    }
}

fn format_line(now: SystemTime, record: &Record) -> String {
    let mut line = String::with_capacity(256);
    let _ = write!(
        line,
        "{} {:<5} {}: {}",
        // humantime panics on a time before 1970; a clock there (a shim, a broken RTC)
        // must not abort the process at its next log line. Said as 1970, as `unix_ms` does.
        humantime::format_rfc3339_millis(now.max(UNIX_EPOCH)),
        record.level(),
        record.target(),
        record.args()
    );
    let _ = record.key_values().visit(&mut Fields(&mut line));
    let mut line = escape_controls(line);
    line.push('\n');
    line
}

/// A message or value with a newline would forge a second record, and a carriage return
/// or a terminal escape (a client certificate's name, a sender's text) would overwrite or
/// recolour the line on a terminal: every control character is written escaped (`\n`,
/// `\r`, `\u{1b}`), so one record stays one line and reads as it is. So is a
/// bidirectional override or isolate (U+202A–U+202E, U+2066–U+2069, and the marks U+200E,
/// U+200F, U+061C): not control characters to Unicode, yet one in a name makes a terminal
/// or a log viewer show the rest of the line reversed ("Trojan Source"); and so are the
/// invisible ones that make one name read as another, or a line as two (zero-width
/// spaces and joiners, U+2028 and U+2029, the BOM).
fn escape_controls(text: String) -> String {
    if !text.contains(needs_escape) {
        return text;
    }
    text.chars()
        .fold(String::with_capacity(text.len() + 16), |mut l, c| {
            if needs_escape(c) {
                l.extend(c.escape_default());
            } else {
                l.push(c);
            }
            l
        })
}

fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            // Zero-width and direction marks, line and paragraph separators, bidi
            // embeddings and overrides, word joiner to the isolates, the BOM.
            '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2069}'
                | '\u{61c}'
                | '\u{feff}'
        )
}

/// Appends ` key=value` pairs; a value with spaces, quotes or `=` is quoted so that the line
/// stays machine-splittable.
struct Fields<'a>(&'a mut String);

impl<'kvs> VisitSource<'kvs> for Fields<'_> {
    fn visit_pair(&mut self, key: Key<'kvs>, value: Value<'kvs>) -> Result<(), log::kv::Error> {
        // Written in place and quoted only if it turns out to need it: a request's line has
        // seven fields, and copying each first was seven allocations per request.
        let _ = write!(self.0, " {key}=");
        let at = self.0.len();
        let _ = write!(self.0, "{value}");
        let written = &self.0[at..];
        let plain = !written.is_empty()
            && !written
                .chars()
                .any(|c| c.is_whitespace() || c == '"' || c == '=');
        if !plain {
            let value = self.0.split_off(at);
            let _ = write!(self.0, "{value:?}");
        }
        Ok(())
    }
}

/// How often the accept loops' failures are said at most ([`Throttled`]).
pub const REPEATED_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// A warning for a condition that can repeat at every turn of a loop (an accept that fails
/// while descriptors are out, ~30 a second; connections refused over their address's
/// share): said at most once per `every`, with how many times it happened since it was
/// last said, so the journal keeps the news and not the flood.
#[derive(Debug)]
pub struct Throttled {
    every: std::time::Duration,
    last: Option<std::time::Instant>,
    held: u64,
}

impl Throttled {
    pub const fn new(every: std::time::Duration) -> Self {
        Throttled {
            every,
            last: None,
            held: 0,
        }
    }

    /// It happened at `now`: `None` to hold the warning back, or how many times it
    /// happened since the warning was last said, this one included.
    pub fn say(&mut self, now: std::time::Instant) -> Option<u64> {
        self.held += 1;
        self.due(now)
    }

    /// How many times it happened since it was last said, if any and if a period has
    /// passed since: for a timer to say the last of a burst, which no later event comes
    /// to say.
    pub fn due(&mut self, now: std::time::Instant) -> Option<u64> {
        if self.held == 0
            || self
                .last
                .is_some_and(|t| now.duration_since(t) < self.every)
        {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held))
    }

    /// At the stop: whatever is held back, said now.
    pub fn rest(&mut self) -> Option<u64> {
        (self.held > 0).then(|| std::mem::take(&mut self.held))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the process logger hands the journal: this crate's records, with their fields
    /// in the message and control characters escaped; other crates' only at error, at
    /// info.
    #[test]
    fn the_journal_hears_other_crates_only_at_error() {
        #[derive(Default)]
        struct Heard(std::sync::Mutex<Vec<(String, String)>>);
        impl Log for Heard {
            fn enabled(&self, _: &Metadata) -> bool {
                true
            }
            fn log(&self, record: &Record) {
                let heard = (record.target().to_owned(), record.args().to_string());
                self.0.lock().unwrap().push(heard);
            }
            fn flush(&self) {}
        }
        let journal = Filtered {
            inner: Journal(Heard::default()),
            max: LevelFilter::Info,
        };
        let fields = [("key", "k1")];
        for (target, level) in [
            ("hoox_edge::gateway::webhook", log::Level::Warn),
            ("rustls::common_state", log::Level::Warn),
            ("rustls::common_state", log::Level::Error),
        ] {
            journal.log(
                &Record::builder()
                    .target(target)
                    .level(level)
                    .args(format_args!("said\u{1b}[2K"))
                    .key_values(&fields)
                    .build(),
            );
        }
        let heard = journal.inner.0.0.lock().unwrap().clone();
        let said = "said\\u{1b}[2K key=k1".to_string();
        assert_eq!(
            heard,
            [
                ("hoox_edge::gateway::webhook".to_string(), said.clone()),
                ("rustls::common_state".to_string(), said),
            ]
        );
    }

    /// This crate's records go by the level; other crates' only at error, unless the level
    /// is debug or finer.
    #[test]
    fn other_crates_are_heard_at_error_unless_debugging() {
        let at = |target: &str, level: log::Level, max: LevelFilter| {
            wanted(
                &Metadata::builder().target(target).level(level).build(),
                max,
            )
        };
        use log::Level::{Debug, Error, Warn};
        assert!(at("hoox_edge::gateway", Warn, LevelFilter::Info));
        assert!(at("rustls::common_state", Error, LevelFilter::Info));
        assert!(!at("rustls::common_state", Warn, LevelFilter::Info));
        assert!(!at("rustls::common_state", Warn, LevelFilter::Warn));
        assert!(at("rustls::common_state", Warn, LevelFilter::Debug));
        assert!(at("rustls::common_state", Debug, LevelFilter::Trace));
    }
    use std::time::Duration;

    #[test]
    fn a_throttled_warning_is_said_once_per_period_with_the_count_held_back() {
        let mut t = Throttled::new(Duration::from_secs(10));
        let t0 = std::time::Instant::now();
        assert_eq!(t.say(t0), Some(1));
        assert_eq!(t.say(t0 + Duration::from_millis(50)), None);
        assert_eq!(t.say(t0 + Duration::from_secs(9)), None);
        assert_eq!(t.say(t0 + Duration::from_secs(10)), Some(3));
        assert_eq!(t.say(t0 + Duration::from_secs(21)), Some(1));
        // Held back, then said by the timer once the period is over, not before; and the
        // rest at the stop.
        assert_eq!(t.say(t0 + Duration::from_secs(22)), None);
        assert_eq!(t.due(t0 + Duration::from_secs(30)), None);
        assert_eq!(t.due(t0 + Duration::from_secs(31)), Some(1));
        assert_eq!(t.due(t0 + Duration::from_secs(99)), None, "nothing held");
        assert_eq!(t.say(t0 + Duration::from_secs(100)), Some(1));
        assert_eq!(t.say(t0 + Duration::from_secs(101)), None);
        assert_eq!(t.rest(), Some(1));
        assert_eq!(t.rest(), None);
    }

    fn line(args: std::fmt::Arguments, kvs: &[(&str, &str)]) -> String {
        let at = UNIX_EPOCH + Duration::from_millis(1_764_478_200_123);
        format_line(
            at,
            &Record::builder()
                .level(log::Level::Warn)
                .target("hoox_edge::mutex")
                .args(args)
                .key_values(&kvs)
                .build(),
        )
    }

    /// A clock before 1970 is said as 1970: humantime panics on it, which aborted the process.
    #[test]
    fn a_line_at_a_time_before_1970_is_stamped_1970() {
        let record = Record::builder().args(format_args!("x")).build();
        let line = format_line(UNIX_EPOCH - Duration::from_secs(1), &record);
        assert!(line.starts_with("1970-01-01T00:00:00.000Z "), "{line}");
    }

    /// The journal's message is escaped as a stderr line is: a raw control character (a
    /// client certificate's name) made `journalctl` show the whole message as "[blob data]".
    #[test]
    fn the_journals_message_escapes_control_characters_too() {
        let kvs = [("client", "desk\u{1b}[2K")];
        let got = journal_text(
            &Record::builder()
                .args(format_args!("client certificate a\rb no longer verifies"))
                .key_values(&kvs)
                .build(),
        );
        assert_eq!(
            got,
            "client certificate a\\rb no longer verifies client=desk\\u{1b}[2K"
        );
    }

    #[test]
    fn a_line_has_time_level_target_message_and_fields() {
        let got = line(
            format_args!("release failed"),
            &[("key", "acct1:live:abc"), ("error", "disk full")],
        );
        assert_eq!(
            got,
            "2025-11-30T04:50:00.123Z WARN  hoox_edge::mutex: release failed \
             key=acct1:live:abc error=\"disk full\"\n"
        );
    }

    #[test]
    fn control_characters_cannot_forge_a_record() {
        let got = line(
            format_args!("bad\n2025-01-01T00:00:00Z ERROR forged"),
            &[("v", "a\nb")],
        );
        assert_eq!(got.matches('\n').count(), 1, "{got:?}");
        assert!(got.ends_with('\n'));
        // A carriage return would put a forged line over the real one on a terminal, and
        // an escape sequence recolour it: both written as escapes.
        let got = line(
            format_args!("client certificate desk\r\u{1b}[31mERROR forged"),
            &[("client", "cert.a\u{7}b")],
        );
        assert!(
            !got.trim_end_matches('\n').contains(char::is_control),
            "{got:?}"
        );
        assert!(got.contains("desk\\r\\u{1b}[31mERROR forged"), "{got:?}");
        assert!(got.contains("\\u{7}"), "{got:?}");
        // A right-to-left override would show the rest of the line reversed: escaped too,
        // in the message and in a field's value.
        let got = line(
            format_args!("client certificate desk\u{202e}lanigiro"),
            &[("client", "a\u{2067}b\u{200f}c")],
        );
        assert!(
            got.contains("desk\\u{202e}lanigiro") && got.contains("\\u{2067}b\\u{200f}c"),
            "{got:?}"
        );
        // Invisible: a zero-width space inside a name, a line separator, a BOM.
        let got = line(format_args!("desk\u{200b}a\u{2028}b\u{feff}"), &[]);
        assert!(got.contains("desk\\u{200b}a\\u{2028}b\\u{feff}"), "{got:?}");
    }

    /// `init` installs a process-wide logger, so it runs in a child: the test binary re-run
    /// with a role, its stderr in a file the parent reads.
    #[test]
    fn init_logs_to_stderr_at_the_level_given_once() {
        const NAME: &str = "platform::log::tests::init_logs_to_stderr_at_the_level_given_once";
        const ROLE: &str = "HOOX_LOG_TEST_ROLE";
        if std::env::var_os(ROLE).is_some() {
            init(LevelFilter::Info);
            log::info!(trade = "k1", outcome = "committed"; "accepted");
            log::debug!("hidden");
            init(LevelFilter::Trace); // ignored: the first logger and level stay
            log::debug!("still hidden");
            log::warn!("last");
            return;
        }
        use std::os::unix::fs::MetadataExt;
        let run = |journal_stream: bool| {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join("stderr");
            let file = std::fs::File::create(&path).expect("stderr file");
            let meta = file.metadata().expect("stat");
            let mut cmd = crate::testing::rerun(NAME).expect("exe");
            cmd.env(ROLE, "child")
                .env_remove("JOURNAL_STREAM")
                .stderr(file);
            if journal_stream {
                // stderr *is* the journal stream, but no journald listens: fall back to stderr.
                cmd.env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()));
            }
            assert!(crate::testing::passed(&cmd.output().expect("run child")));
            std::fs::read_to_string(&path).expect("read stderr")
        };

        let mut cases = vec![run(false)];
        // Where a journald listens (a test run under systemd), that case would go to the journal.
        if !std::path::Path::new("/run/systemd/journal/socket").exists() {
            cases.push(run(true));
        }
        for out in cases {
            let lines: Vec<&str> = out
                .lines()
                .filter(|l| l.contains("platform::log"))
                .collect();
            assert_eq!(lines.len(), 2, "{out}");
            assert!(
                lines[0].contains(
                    " INFO  hoox_edge::platform::log::tests: accepted trade=k1 outcome=committed"
                ),
                "{out}"
            );
            assert!(
                lines[1].contains(" WARN  hoox_edge::platform::log::tests: last"),
                "{out}"
            );
            assert!(!out.contains("hidden"), "{out}");
        }
    }

    #[test]
    fn empty_and_quoted_values_are_quoted() {
        let got = line(format_args!("m"), &[("a", ""), ("b", "x=\"y\"")]);
        assert!(got.ends_with(" a=\"\" b=\"x=\\\"y\\\"\"\n"), "{got:?}");
    }
}
