//! `dmc_compiler::json`: the pretty JSON of plans and reports, with their large arrays printed on
//! two threads, is serde_json's `to_writer_pretty` output byte for byte.

use dmc_compiler::json::{write_array, write_plan, write_pretty_with, PARALLEL_ELEMENTS};
use dmc_compiler::plan::Plan;
use dmc_compiler::report::{memory_report, render_json, write_json};
use dmc_compiler::testutil::*;
use dmc_compiler::{compile, CompileOptions};
use dmc_grammar::compile_source;
use serde::Serialize;

fn plan_json(p: &Plan) -> Vec<u8> {
    let mut p = p.clone();
    let mut out = Vec::new();
    write_plan(&mut out, &mut p).unwrap();
    assert_eq!(p, p.clone(), "the plan is put back");
    out
}

/// A chain long enough for arrays of more than [`PARALLEL_ELEMENTS`] elements.
fn chain(n: usize) -> Plan {
    let src = format!(
        "input x: [8]\ntarget y: [8]\nout = x |> repeat {n} {{ dense(8) }}\nloss mse(out, y)\ntrain {{ batch: 2, optimizer: adam(lr: 0.01) }}\n"
    );
    let model = compile_source(&src, "chain.dm").unwrap();
    compile(&model, &CompileOptions::default()).unwrap()
}

#[test]
fn plans_print_as_serde_json_prints_them() {
    let mut plans: Vec<Plan> = small_fixtures(adam(1e-3))
        .into_iter()
        .map(|(_, m)| compile(&m, &CompileOptions::default()).unwrap())
        .collect();
    let long = chain(PARALLEL_ELEMENTS);
    assert!(long.buffers.len() > PARALLEL_ELEMENTS && long.steps.len() > PARALLEL_ELEMENTS);
    assert!(long.params.len() > PARALLEL_ELEMENTS && long.opt_state.len() > PARALLEL_ELEMENTS);
    plans.push(long);
    for p in &plans {
        let want = serde_json::to_vec_pretty(p).unwrap();
        let got = plan_json(p);
        assert!(
            got == want,
            "{} bytes, serde_json {}",
            got.len(),
            want.len()
        );
        // It reads back.
        let back: Plan = serde_json::from_slice(&got).unwrap();
        assert_eq!(&back, p);
    }
    // A plan without steps or buffers: empty arrays.
    let mut empty = plans[0].clone();
    empty.buffers.clear();
    empty.steps.clear();
    empty.opt_state.clear();
    assert_eq!(
        plan_json(&empty),
        serde_json::to_vec_pretty(&empty).unwrap()
    );
}

#[test]
fn reports_print_as_serde_json_prints_them() {
    for p in [
        compile(&mlp(sgd(0.1)), &CompileOptions::default()).unwrap(),
        chain(3 * PARALLEL_ELEMENTS),
    ] {
        let mut r = memory_report(&p);
        assert_eq!(r.timeline.len(), p.steps.len());
        let before = r.clone();
        let mut out = Vec::new();
        write_json(&mut out, &mut r).unwrap();
        assert_eq!(r, before, "the report is put back");
        assert!(String::from_utf8(out).unwrap() == render_json(&before));
    }
}

#[derive(Serialize)]
struct Nested {
    name: String,
    deep: Vec<Vec<u32>>,
    text: &'static str,
}

#[derive(Serialize)]
struct Doc {
    first: u32,
    items: Vec<Nested>,
    between: Vec<u8>,
    more: Vec<u64>,
    last: Option<String>,
}

#[test]
fn arrays_of_any_size_and_depth() {
    for n in [
        0,
        1,
        2,
        3,
        PARALLEL_ELEMENTS,
        PARALLEL_ELEMENTS + 1,
        2 * PARALLEL_ELEMENTS + 3,
    ] {
        let items: Vec<Nested> = (0..n)
            .map(|i| Nested {
                name: format!("n\"{i}\n"),
                deep: vec![vec![i as u32; i % 3], vec![]],
                text: "a\nb",
            })
            .collect();
        let more: Vec<u64> = (0..n as u64).collect();
        let doc = Doc {
            first: 1,
            items,
            between: vec![1, 2],
            more,
            last: Some("x".into()),
        };
        let want = serde_json::to_vec_pretty(&doc).unwrap();
        // The whole array at depth 0 is the array printed alone.
        let mut alone = Vec::new();
        write_array(&mut alone, &doc.more, 0).unwrap();
        assert_eq!(alone, serde_json::to_vec_pretty(&doc.more).unwrap());
        // Taken out of the document and written in its place.
        let skeleton = Doc {
            first: doc.first,
            items: vec![],
            between: doc.between.clone(),
            more: vec![],
            last: doc.last.clone(),
        };
        let mut got = Vec::new();
        write_pretty_with(
            &mut got,
            &skeleton,
            &mut [
                ("items", &mut |w| write_array(w, &doc.items, 1)),
                ("more", &mut |w| write_array(w, &doc.more, 1)),
            ],
        )
        .unwrap();
        assert!(
            got == want,
            "n = {n}:\n{}\n---\n{}",
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&want)
        );
    }
    // A key the skeleton has no empty array under is an error, not a wrong document.
    let doc = Doc {
        first: 1,
        items: vec![],
        between: vec![3],
        more: vec![],
        last: None,
    };
    let mut got = Vec::new();
    let r = write_pretty_with(
        &mut got,
        &doc,
        &mut [("between", &mut |w| write_array(w, &[3u8], 1))],
    );
    assert!(r.is_err());
}

#[derive(Serialize)]
struct Inner {
    count: u32,
    list: Vec<Nested>,
}

#[derive(Serialize)]
struct Outer {
    head: Inner,
    list: Vec<u8>,
    tail: Vec<u64>,
}

#[test]
fn arrays_of_nested_objects_by_path() {
    for n in [0, 1, PARALLEL_ELEMENTS + 1] {
        let list: Vec<Nested> = (0..n)
            .map(|i| Nested {
                name: format!("m{i}"),
                deep: vec![vec![i as u32; i % 2]],
                text: "c",
            })
            .collect();
        let tail: Vec<u64> = (0..n as u64).collect();
        let doc = Outer {
            head: Inner { count: 7, list },
            list: vec![4, 5],
            tail,
        };
        let want = serde_json::to_vec_pretty(&doc).unwrap();
        let skeleton = Outer {
            head: Inner {
                count: 7,
                list: vec![],
            },
            list: vec![4, 5],
            tail: vec![],
        };
        let mut got = Vec::new();
        write_pretty_with(
            &mut got,
            &skeleton,
            &mut [
                ("head.list", &mut |w| write_array(w, &doc.head.list, 2)),
                ("tail", &mut |w| write_array(w, &doc.tail, 1)),
            ],
        )
        .unwrap();
        assert!(
            got == want,
            "n = {n}:\n{}\n---\n{}",
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&want)
        );
    }
    // `list` is not empty at the top level, and there is no `head.tail`.
    let skeleton = Outer {
        head: Inner {
            count: 1,
            list: vec![],
        },
        list: vec![1],
        tail: vec![],
    };
    for key in ["list", "head.tail"] {
        let mut got = Vec::new();
        let r = write_pretty_with(
            &mut got,
            &skeleton,
            &mut [(key, &mut |w| write_array(w, &[1u8], 1))],
        );
        assert!(r.is_err(), "{key}");
    }
}
