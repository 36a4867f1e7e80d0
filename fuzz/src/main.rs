//! `dmc-fuzz`: runs the fuzz targets and prints what failed (see the crate docs).
//!
//! ```text
//! dmc-fuzz [all|programs|readers|cli] [--cases N] [--plans N] [--reader-cases N] [--cli-cases N]
//!          [--seed S] [--dmc PATH] [--artifacts DIR]
//! ```
//! Exit status 0 when nothing failed, 1 otherwise. Each case is written to
//! `<artifacts>/current-<target>` before it runs, so an abort leaves its reproducer behind.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use dmc_fuzz::{cli, programs, readers, CaseFile, Report};

struct Opts {
    what: String,
    cases: u64,
    plans: u64,
    reader_cases: u64,
    cli_cases: u64,
    seed: u64,
    dmc: PathBuf,
    artifacts: Option<PathBuf>,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        what: "all".into(),
        cases: 100_000,
        plans: 2_000,
        reader_cases: 20_000,
        cli_cases: 200,
        seed: 1,
        dmc: PathBuf::from("target/release/dmc"),
        artifacts: Some(PathBuf::from("target/fuzz")),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |name: &str| -> Result<u64, String> {
            args.next()
                .and_then(|v| v.replace('_', "").parse().ok())
                .ok_or_else(|| format!("{name} needs a whole number"))
        };
        match a.as_str() {
            "all" | "programs" | "readers" | "cli" => o.what = a,
            "--cases" => o.cases = num("--cases")?,
            "--plans" => o.plans = num("--plans")?,
            "--reader-cases" => o.reader_cases = num("--reader-cases")?,
            "--cli-cases" => o.cli_cases = num("--cli-cases")?,
            "--seed" => o.seed = num("--seed")?,
            "--dmc" => o.dmc = args.next().map(PathBuf::from).ok_or("--dmc needs a path")?,
            "--artifacts" => {
                o.artifacts = Some(
                    args.next()
                        .map(PathBuf::from)
                        .ok_or("--artifacts needs a dir")?,
                )
            }
            "-h" | "--help" => {
                println!("dmc-fuzz [all|programs|readers|cli] [--cases N] [--plans N] [--reader-cases N] [--cli-cases N] [--seed S] [--dmc PATH] [--artifacts DIR]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument `{other}` (see --help)")),
        }
    }
    Ok(o)
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    if let Some(d) = &o.artifacts {
        let _ = std::fs::create_dir_all(d);
    }
    dmc_fuzz::quiet_panics();
    let dir = o.artifacts.as_deref();
    let mut total = Report::default();
    let t0 = Instant::now();
    if matches!(o.what.as_str(), "all" | "programs") {
        let t = Instant::now();
        let r = programs::run(
            o.cases,
            o.plans,
            o.seed,
            &mut CaseFile::new(dir, "programs"),
        );
        println!(
            "programs: {} mutated programs checked, {} accepted, {} planned in train/eval/predict, {} failures ({:.1} s)",
            r.cases, r.accepted, r.planned, r.failures.len(), t.elapsed().as_secs_f64()
        );
        total.merge(r);
    }
    if matches!(o.what.as_str(), "all" | "readers") {
        let t = Instant::now();
        let r = readers::run(o.reader_cases, o.seed, &mut CaseFile::new(dir, "readers"));
        println!(
            "readers: {} mutated files loaded, {} accepted, {} failures ({:.1} s)",
            r.cases,
            r.accepted,
            r.failures.len(),
            t.elapsed().as_secs_f64()
        );
        total.merge(r);
    }
    if matches!(o.what.as_str(), "all" | "cli") {
        let t = Instant::now();
        let r = cli::run(
            &o.dmc,
            o.cli_cases,
            o.seed,
            Duration::from_secs(20),
            &mut CaseFile::new(dir, "cli"),
        );
        println!(
            "cli: {} command lines, {} exited 0, {} failures ({:.1} s)",
            r.cases,
            r.accepted,
            r.failures.len(),
            t.elapsed().as_secs_f64()
        );
        total.merge(r);
    }
    if let Some(d) = dir {
        for (i, f) in total.failures.iter().enumerate().take(100) {
            let _ = std::fs::write(d.join(format!("failure-{i}-{}", f.target)), &f.case);
        }
    }
    for f in total.failures.iter().take(20) {
        println!(
            "\nFAILURE [{}]: {}\n--- case ---\n{}\n------------",
            f.target,
            f.what,
            f.short_case()
        );
    }
    println!(
        "total: {} cases, {} failures, {:.1} s",
        total.cases,
        total.failures.len(),
        t0.elapsed().as_secs_f64()
    );
    std::process::exit(i32::from(!total.failures.is_empty()));
}
