//! Reading and writing whole files, in one place, with the rules every command relies on:
//!
//! * reads refuse what is not a regular file (a FIFO, `/dev/zero`, a socket: they may never end)
//!   and files larger than this machine's memory, before reading anything;
//! * writes are atomic, all through one function (`replace_file`: a `tempfile` temp file
//!   `.<name>.tmp.<pid>.<random>` in the target's directory, fsync, `persist`, a rename),
//!   never replace something that is not a regular file (a device node, a FIFO, a directory), and
//!   write *through* a symbolic link to the regular file it names (the link stays a link);
//! * a temp file is removed on every error path; the temp files being written are registered, so a
//!   signal handler that ends the process can remove them ([`remove_temp_files_in_flight`]); and
//!   the temp files of earlier processes that were killed (SIGKILL, power loss) are swept away the
//!   next time the same file is written;
//! * [`check_writable`] tells, before a long run starts, whether its output file can be written.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::IoError;

/// Temp files being written right now, for [`remove_temp_files_in_flight`].
static IN_FLIGHT: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Removes the temp files of atomic writes in progress. For a handler that ends the process in
/// the middle of a save (a second Ctrl-C): the target is untouched and nothing is left behind.
pub fn remove_temp_files_in_flight() {
    let list = match IN_FLIGHT.lock() {
        Ok(l) => l.clone(),
        Err(poisoned) => poisoned.into_inner().clone(),
    };
    for p in list {
        let _ = fs::remove_file(p);
    }
}

/// Registers a temp file while it exists; deregisters it on drop.
struct InFlight(PathBuf);

impl InFlight {
    fn new(p: PathBuf) -> InFlight {
        if let Ok(mut l) = IN_FLIGHT.lock() {
            l.push(p.clone());
        }
        InFlight(p)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // The temp file itself is removed by `tempfile` (on error) or renamed (on success).
        if let Ok(mut l) = IN_FLIGHT.lock() {
            l.retain(|p| p != &self.0);
        }
    }
}

/// What kind of file system object `m` is, in words.
pub(crate) fn kind_of(m: &fs::Metadata) -> &'static str {
    let t = m.file_type();
    if t.is_dir() {
        return "directory";
    }
    if t.is_symlink() {
        return "symbolic link";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_char_device() {
            return "character device";
        }
        if t.is_block_device() {
            return "block device";
        }
        if t.is_fifo() {
            return "FIFO (named pipe)";
        }
        if t.is_socket() {
            return "socket";
        }
    }
    if t.is_file() {
        "regular file"
    } else {
        "special file"
    }
}

/// The error of reading `path` (the `what` of a command: "data", "weights"): [`IoError::NotFound`]
/// for a missing file, else [`IoError::Read`].
pub(crate) fn read_error<'a>(
    path: &'a Path,
    what: &'static str,
) -> impl Fn(std::io::Error) -> IoError + Copy + 'a {
    move |e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            IoError::NotFound {
                path: path.to_path_buf(),
                what,
            }
        } else {
            IoError::Read {
                path: path.to_path_buf(),
                source: e,
            }
        }
    }
}

/// Reads a whole regular file. A missing file is [`IoError::NotFound`]; a FIFO, device or socket
/// is [`IoError::NotRegularFile`] (nothing is read from it); a file larger than the machine's
/// memory is [`IoError::TooLarge`].
pub(crate) fn read_file(path: &Path, what: &'static str) -> Result<Vec<u8>, IoError> {
    let read_err = read_error(path, what);
    let meta = fs::metadata(path).map_err(read_err)?;
    if !meta.is_file() {
        return Err(IoError::NotRegularFile {
            path: path.to_path_buf(),
            kind: kind_of(&meta),
            what,
        });
    }
    if let Some(mem) = crate::alloc::physical_memory() {
        if meta.len() > mem {
            return Err(IoError::TooLarge {
                path: path.to_path_buf(),
                what,
                bytes: meta.len(),
                limit: mem,
            });
        }
    }
    // Bounded even if the file grows while it is read.
    let mut out = Vec::new();
    out.try_reserve_exact(meta.len() as usize)
        .map_err(|_| IoError::TooLarge {
            path: path.to_path_buf(),
            what,
            bytes: meta.len(),
            limit: crate::alloc::physical_memory().unwrap_or(0),
        })?;
    let f = fs::File::open(path).map_err(read_err)?;
    std::io::Read::read_to_end(&mut std::io::Read::take(f, meta.len()), &mut out)
        .map_err(read_err)?;
    Ok(out)
}

/// The file an atomic write of `path` replaces: `path` itself, or the regular file a symbolic link
/// at `path` points to. Fails when it exists and is not a regular file.
pub(crate) fn write_target(path: &Path) -> Result<PathBuf, IoError> {
    let refuse = |kind: &'static str| IoError::NotWritable {
        path: path.to_path_buf(),
        reason: format!("it is a {kind}, not a regular file, and dmc only replaces regular files"),
        hint: "choose a path to a regular file, e.g. out/weights.safetensors".into(),
    };
    match fs::symlink_metadata(path) {
        Err(_) => Ok(path.to_path_buf()),
        Ok(m) if m.file_type().is_symlink() => match fs::metadata(path) {
            // A link to a regular file: write the file it names, keep the link.
            Ok(t) if t.is_file() => fs::canonicalize(path).map_err(|e| IoError::NotWritable {
                path: path.to_path_buf(),
                reason: format!("cannot resolve the symbolic link: {e}"),
                hint: "choose a path to a regular file".into(),
            }),
            Ok(t) => Err(IoError::NotWritable {
                path: path.to_path_buf(),
                reason: format!(
                    "it is a symbolic link to a {}, not to a regular file",
                    kind_of(&t)
                ),
                hint: "choose a path to a regular file, e.g. out/weights.safetensors".into(),
            }),
            Err(_) => Err(IoError::NotWritable {
                path: path.to_path_buf(),
                reason: "it is a symbolic link to nothing (dangling)".into(),
                hint: "remove the link or choose another path".into(),
            }),
        },
        Ok(m) if m.is_file() => Ok(path.to_path_buf()),
        Ok(m) if m.is_dir() => Err(IoError::NotWritable {
            path: path.to_path_buf(),
            reason: "it is a directory".into(),
            hint: "pass a file path, e.g. <dir>/weights.safetensors".into(),
        }),
        Ok(m) => Err(refuse(kind_of(&m))),
    }
}

fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

fn temp_prefix(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".to_string());
    format!(".{name}.tmp.")
}

/// Whether process `pid` is alive (on Unix: it exists, even if owned by someone else).
fn process_alive(pid: u32) -> bool {
    #[cfg(unix)]
    {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return false;
        };
        // SAFETY: signal 0 only checks for existence and permission; no signal is sent.
        let r = unsafe { libc::kill(pid, 0) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        true
    }
}

/// Removes `.<name>.tmp.<pid>[.<random>]` files next to `path` left by processes that no longer
/// exist (a save killed by SIGKILL or a power loss). Best effort: errors are ignored.
pub(crate) fn sweep_stale_temps(path: &Path) {
    let prefix = temp_prefix(path);
    let Ok(entries) = fs::read_dir(dir_of(path)) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|rest| rest.split('.').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let is_file = e.file_type().is_ok_and(|t| t.is_file());
        if is_file && pid != std::process::id() && !process_alive(pid) {
            let _ = fs::remove_file(e.path());
        }
    }
}

/// Whether an atomic write waits for its data to reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durability {
    /// fsync the file before the rename and the directory after it: for what the user asked to
    /// save (weights, checkpoints, predictions, plans).
    Synced,
    /// No fsync: for cache entries, which carry a checksum and are rebuilt when damaged.
    Cache,
}

/// The one atomic file writer of dmc: `write` fills a temp file `.<name>.tmp.<pid>.<random>`
/// ([`tempfile::Builder`]) in the directory of `target`, which is then (with
/// [`Durability::Synced`]) fsynced and renamed over `target` (`NamedTempFile::persist`). On any
/// error, or a panic in `write`, the temp file is removed and `target` is untouched. The temp file
/// is registered while it exists, so that a signal handler ending the process removes it too
/// ([`remove_temp_files_in_flight`]). `target` must already be resolved ([`write_target`]); the
/// callers that write into a cache create the directory first.
pub(crate) fn replace_file(
    target: &Path,
    durability: Durability,
    write: impl FnOnce(&mut std::io::BufWriter<fs::File>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let prefix = format!("{}{}.", temp_prefix(target), std::process::id());
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).rand_bytes(6);
    // As a file created by `File::create` (0666 less the umask), not tempfile's private 0600:
    // saved weights stay readable by whoever could read them before.
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    let tmp = builder.tempfile_in(dir_of(target))?;
    let (file, tmp) = tmp.into_parts();
    let _registered = InFlight::new(tmp.to_path_buf());
    let mut w = std::io::BufWriter::new(file);
    write(&mut w)?;
    w.flush()?;
    let file = w.into_inner().map_err(|e| e.into_error())?;
    if durability == Durability::Synced {
        file.sync_all()?;
    }
    drop(file);
    tmp.persist(target).map_err(|e| e.error)?;
    if durability == Durability::Synced {
        // Make the rename durable (best effort: not every platform can fsync a directory).
        if let Ok(d) = fs::File::open(dir_of(target)) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// Writes a file the user asked for atomically (see [`replace_file`], fsynced): refuses a target
/// that is not a regular file ([`write_target`]: `path`, or the regular file a link at `path`
/// names), sweeps the temp files of killed earlier saves, and turns a failure into an [`IoError`]
/// that says what to do.
pub(crate) fn atomic_write(
    path: &Path,
    write: impl FnOnce(&mut std::io::BufWriter<fs::File>) -> std::io::Result<()>,
) -> Result<(), IoError> {
    let target = write_target(path)?;
    sweep_stale_temps(&target);
    replace_file(&target, Durability::Synced, write).map_err(|e| {
        // A missing or unwritable directory gets the clearer diagnosis of `check_writable`.
        match check_writable(path) {
            Err(diagnosed) => diagnosed,
            Ok(()) => IoError::Write {
                path: path.to_path_buf(),
                source: e,
            },
        }
    })
}

/// Writes `bytes` to `path` atomically (see `atomic_write`): for plans, reports and drawings.
pub fn write_file_atomic(path: &Path, bytes: &[u8]) -> Result<(), IoError> {
    atomic_write(path, |w| w.write_all(bytes))
}

/// [`write_file_atomic`] of what `write` writes into the (buffered) temp file, for output too
/// large to build in memory first (the plan of a deep network: hundreds of MB of JSON).
pub fn write_file_atomic_with(
    path: &Path,
    write: impl FnOnce(&mut std::io::BufWriter<fs::File>) -> std::io::Result<()>,
) -> Result<(), IoError> {
    atomic_write(path, write)
}

/// Checks, before training starts, that `path` can be written: it is not a directory, device,
/// FIFO or other non-regular file (a symbolic link is checked at the file it names), its directory
/// exists and a file can be created there (a temp file is created and deleted).
pub fn check_writable(path: &Path) -> Result<(), IoError> {
    let resolved = write_target(path)?;
    let path = resolved.as_path();
    let err = |reason: String, hint: &str| IoError::NotWritable {
        path: path.to_path_buf(),
        reason,
        hint: hint.to_string(),
    };
    if path.file_name().is_none() {
        return Err(err(
            "the path has no file name".into(),
            "pass a file path, e.g. out/weights.safetensors",
        ));
    }
    if path.is_dir() {
        return Err(err(
            "it is a directory".into(),
            "pass a file path, e.g. <dir>/weights.safetensors",
        ));
    }
    let dir: PathBuf = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    match fs::metadata(&dir) {
        Err(_) => {
            return Err(err(
                format!("the directory {} does not exist", dir.display()),
                "create it first (mkdir -p) or choose another path",
            ))
        }
        Ok(m) if !m.is_dir() => {
            return Err(err(
                format!("{} is not a directory", dir.display()),
                "choose a path inside a directory",
            ))
        }
        Ok(_) => {}
    }
    let probe = dir.join(format!(".dmc-write-check.{}", std::process::id()));
    match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(f) => {
            drop(f);
            let _ = fs::remove_file(&probe);
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            // A stale probe from this pid: it was creatable, so the directory is writable.
            let _ = fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => Err(err(
            format!("cannot create files in {}: {e}", dir.display()),
            "fix the directory's permissions or choose another path",
        )),
    }
}
