//! mimalloc's options by name (`dmc_runtime::mi_options`): the index found for a name is the
//! option of that name, as `mi_option_get` and mimalloc's own listing (its environment variable
//! `MIMALLOC_<NAME>`) see it.

use dmc_runtime::mi_options;

// One test: the options are process-wide, and tests in one binary run in parallel.
#[test]
fn options_by_name_and_the_compiling_tune() {
    finds_sets_and_reads_options_by_name();
    tunes_a_compiling_process();
}

fn finds_sets_and_reads_options_by_name() {
    let purge = mi_options::index_of("purge_delay").expect("mimalloc has purge_delay");
    let thp = mi_options::index_of("allow_thp").expect("mimalloc has allow_thp");
    let verbose = mi_options::index_of("verbose").expect("mimalloc has verbose");
    // Distinct options; `show_errors` is mimalloc's first option in every version.
    assert_eq!(mi_options::index_of("show_errors"), Some(0));
    assert!(purge != thp && purge != verbose && thp != verbose);
    // A prefix of a name is not that name.
    assert_eq!(mi_options::index_of("purge"), None);
    assert_eq!(mi_options::index_of("no_such_option"), None);
    assert!(!mi_options::set("no_such_option", 1));

    let old = mi_options::get("purge_delay").expect("readable");
    assert!(mi_options::set("purge_delay", old + 7));
    assert_eq!(mi_options::get("purge_delay"), Some(old + 7));
    // Setting one option leaves the others.
    let thp_before = mi_options::get("allow_thp");
    assert!(mi_options::set("purge_delay", old));
    assert_eq!(mi_options::get("purge_delay"), Some(old));
    assert_eq!(mi_options::get("allow_thp"), thp_before);
}

fn tunes_a_compiling_process() {
    assert_eq!(mi_options::tune_for_compiling(), Vec::<&str>::new());
    assert_eq!(mi_options::get("purge_delay"), Some(-1));
    assert_eq!(mi_options::get("allow_thp"), Some(0));
    #[cfg(target_os = "linux")]
    {
        // SAFETY: PR_GET_THP_DISABLE only reads a flag of this process.
        let disabled = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        assert_eq!(disabled, 1);
    }
    // Memory still works.
    let v: Vec<u64> = (0..1_000_000).collect();
    assert_eq!(v.iter().sum::<u64>(), 999_999 * 1_000_000 / 2);
}
