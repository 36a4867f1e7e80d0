//! The CPU time model's calibration on this machine (`dmc_runtime::cpu::calibrate`): what it
//! measures, its cache, and that rates measured while the machine held back threads are used
//! once and never cached (they would predict every later plan slow).

use dmc_plan::cpu::CpuRates;
use dmc_runtime::cpu::calibrate;

#[test]
fn calibration_measures_positive_rates_and_caches_them() {
    let r = calibrate::measure();
    for (name, v) in [
        ("gemm_flops", r.gemm_flops),
        ("pack_bytes", r.pack_bytes),
        ("im2col", r.im2col_elems),
        ("im2col_fwd", r.im2col_fwd_elems),
        ("col2im", r.col2im_elems),
        ("stream", r.stream_bytes),
        ("cached stream", r.cached_stream_bytes),
        ("pack runs", r.pack_run_bytes),
    ] {
        assert!(v.is_finite() && v > 0.0, "{name} = {v}");
    }
    assert!(r.cache_bytes > 0);
    assert!(r.gemm_call_s >= 0.0 && r.loop_s >= 0.0);
    assert!(r.threads >= 1);
    assert!(
        r.parallel_share > 0.0 && r.parallel_share <= 1.0,
        "{}",
        r.parallel_share
    );
    // the tests run beside each other: cache these rates as measured on a quiet machine
    let quiet = CpuRates {
        parallel_share: 1.0,
        ..r.clone()
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let got = calibrate::cached_with(Some(dir.path()), || quiet.clone());
    assert_eq!(got, quiet);
    let path = calibrate::cache_path(dir.path());
    assert!(path.is_file(), "cached at {}", path.display());
    // read back, not measured again: an entry marked by hand comes back as it is
    let marked = CpuRates {
        source: "marked".into(),
        ..quiet.clone()
    };
    std::fs::write(&path, serde_json::to_vec(&marked).expect("json")).expect("write");
    let back = calibrate::cached_with(Some(dir.path()), || panic!("measured again"));
    assert_eq!(back.source, "marked");
    // a damaged entry is measured again and replaced
    std::fs::write(&path, b"{ not json").expect("write");
    let again = calibrate::cached_with(Some(dir.path()), || quiet.clone());
    assert_eq!(again, quiet);
    let back: CpuRates =
        serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("valid json");
    assert_eq!(back.source, quiet.source);
}

#[test]
fn rates_measured_while_threads_were_held_back_are_used_once_not_cached() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = calibrate::cache_path(dir.path());
    let threads = rayon::current_num_threads().max(1);
    let busy = CpuRates {
        threads: threads.max(2),
        parallel_share: 0.5,
        source: "busy".into(),
        ..CpuRates::nominal()
    };
    assert!(busy.measured_busy());
    assert!(
        calibrate::busy_note(&busy).contains("50%"),
        "{}",
        calibrate::busy_note(&busy)
    );
    let got = calibrate::cached_with(Some(dir.path()), || busy.clone());
    assert_eq!(got, busy, "used for this run");
    assert!(!path.exists(), "not cached");
    // the next run measures again, and caches rates of a quiet machine
    let quiet = CpuRates {
        parallel_share: CpuRates::BUSY_SHARE,
        source: "quiet".into(),
        ..busy.clone()
    };
    assert!(!quiet.measured_busy());
    assert_eq!(calibrate::busy_note(&quiet), "");
    assert_eq!(
        calibrate::cached_with(Some(dir.path()), || quiet.clone()),
        quiet
    );
    assert!(path.is_file());
    assert_eq!(
        calibrate::cached_with(Some(dir.path()), || busy.clone()).source,
        "quiet"
    );
    // one thread has nobody to wait for
    let one = CpuRates { threads: 1, ..busy };
    assert!(!one.measured_busy());
    // caches from before the share was measured read as measured on a quiet machine
    let mut v = serde_json::to_value(&quiet).expect("json");
    v.as_object_mut().expect("object").remove("parallel_share");
    let old: CpuRates = serde_json::from_value(v).expect("old entry");
    assert_eq!(old.parallel_share, 1.0);
}

#[test]
fn the_probe_sees_threads_that_share_a_core() {
    // twice as many threads as this machine runs at once: each waits half the time for a core,
    // so at most half the threads' work runs in parallel (whatever else the machine runs)
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2 * cores)
        .build()
        .expect("pool");
    let share = pool.install(calibrate::parallel_share);
    assert!(
        share < CpuRates::BUSY_SHARE,
        "{} threads on {cores} cores: share {share}",
        2 * cores
    );
    // one thread: nothing to share
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("pool");
    assert_eq!(one.install(calibrate::parallel_share), 1.0);
}
