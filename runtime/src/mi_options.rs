//! mimalloc's run-time options, set by name (the `dmc` binary allocates through mimalloc, see
//! [`crate::alloc::CountingOver`]).
//!
//! mimalloc numbers its options by a C enum whose order changes between versions; the Rust
//! bindings do not list the ones set here. So an option is found by its name, in the list the
//! library prints of itself (`mi_options_print_out`: one line `option 'NAME': VALUE` per option,
//! in enum order), and set by that index (`mi_option_set`).

use std::ffi::{c_char, c_int, c_long, c_void, CStr};

// The functions are mimalloc's (linked through the `mimalloc` crate).
use mimalloc as _;

extern "C" {
    fn mi_option_set(option: c_int, value: c_long);
    fn mi_option_get(option: c_int) -> c_long;
    fn mi_options_print_out(
        out: Option<unsafe extern "C" fn(msg: *const c_char, arg: *mut c_void)>,
        arg: *mut c_void,
    );
}

/// What the print callback looks for: the index of the line `option '<name>': ...`.
struct Search<'a> {
    name: &'a [u8],
    seen: c_int,
    found: Option<c_int>,
}

/// Called by mimalloc once per printed line; `arg` is the [`Search`].
unsafe extern "C" fn on_line(msg: *const c_char, arg: *mut c_void) {
    if msg.is_null() || arg.is_null() {
        return;
    }
    // SAFETY: `arg` is the `&mut Search` that `index_of` passed, alive for the whole call of
    // `mi_options_print_out`, and not otherwise accessed meanwhile.
    let search = unsafe { &mut *arg.cast::<Search>() };
    // SAFETY: mimalloc passes a NUL-terminated string (its formatting buffer).
    let line = unsafe { CStr::from_ptr(msg) }.to_bytes();
    let Some(rest) = line.strip_prefix(b"option '") else {
        return;
    };
    if search.found.is_none()
        && rest.len() > search.name.len()
        && rest.starts_with(search.name)
        && rest[search.name.len()] == b'\''
    {
        search.found = Some(search.seen);
    }
    search.seen += 1;
}

/// The index of mimalloc's option `name` (e.g. `purge_delay`), `None` if this mimalloc has none
/// of that name.
pub fn index_of(name: &str) -> Option<i32> {
    let mut search = Search {
        name: name.as_bytes(),
        seen: 0,
        found: None,
    };
    // SAFETY: the callback only reads the line it is given and writes `search`, passed as `arg`
    // and alive until the call returns (mimalloc does not keep either).
    unsafe { mi_options_print_out(Some(on_line), (&mut search as *mut Search).cast()) };
    search.found
}

/// The current value of option `name`.
pub fn get(name: &str) -> Option<i64> {
    index_of(name).map(|i| {
        // SAFETY: `index_of` returned a valid option index of the linked mimalloc.
        let v = unsafe { mi_option_get(i) };
        #[allow(clippy::useless_conversion)] // `c_long` is `i64` here, `i32` on some targets
        i64::from(v)
    })
}

/// Sets option `name` to `value`; false (nothing set) if this mimalloc has no such option.
pub fn set(name: &str, value: i64) -> bool {
    let Some(i) = index_of(name) else {
        return false;
    };
    let v = c_long::try_from(value).unwrap_or(if value < 0 { c_long::MIN } else { c_long::MAX });
    // SAFETY: a valid option index of the linked mimalloc; any value is accepted (mimalloc clamps).
    unsafe { mi_option_set(i, v) };
    true
}

/// The options for a short compiling process (`dmc check`, `plan`, `compile`): it allocates a
/// deep network's graph and plan (hundreds of MB at 100,000 layers) and exits. Freed memory is
/// kept for reuse rather than returned to the OS and faulted in again (`purge_delay` -1), and
/// memory comes in 4 KiB pages rather than transparent huge pages (`allow_thp` 0), which the
/// kernel zeroes 2 MiB at a time whether the process touches all of it or not. Together they
/// halve the system time of `dmc plan` at 100,000 layers (BENCHMARKS.md). Long-running commands
/// (`train`) keep mimalloc's defaults. Returns the names of the options this mimalloc lacks.
pub fn tune_for_compiling() -> Vec<&'static str> {
    // mimalloc reads `allow_thp` at start-up (before `main`) to mark its first memory for huge
    // pages; the process-wide switch covers that memory too.
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE only sets a flag of this process's address space.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
    [("purge_delay", -1), ("allow_thp", 0)]
        .into_iter()
        .filter(|&(name, value)| !set(name, value))
        .map(|(name, _)| name)
        .collect()
}
