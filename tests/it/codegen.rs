//! CUDA code generation of the examples' plans: every kernel of every example renders, and the
//! generated sources are pinned by snapshots (one combined snapshot per example). The kernels of
//! every op alone are `codegen/tests/codegen.rs`'.

use dmc_codegen::{kernel_params, render_plan, ArgSource, CodegenOptions};
use dmc_compiler::plan::{Mode, Plan};
use dmc_compiler::CompileOptions;

fn plan_of(example: &str, mode: Mode) -> Plan {
    let path = format!("{}/examples/{example}.dm", env!("CARGO_MANIFEST_DIR"));
    let src = std::fs::read_to_string(&path).expect("example");
    let model = dmc_grammar::compile_source(&src, &path).expect("example compiles");
    dmc_compiler::compile(
        &model,
        &CompileOptions {
            mode,
            verify: false,
            ..CompileOptions::default()
        },
    )
    .expect("plan")
}

pub const EXAMPLES: &[&str] = &["mlp", "seed", "deep_convnet", "resnet_small"];

/// One snapshot per example: the first kernel of each kind in full (the shared prelude cut), the
/// others by name and launch geometry only; the prelude once at the end.
fn combined(plan: &Plan) -> String {
    let mut s = String::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut prelude = String::new();
    for k in render_plan(plan, &CodegenOptions::default()).expect("renders") {
        let kind = plan.kernels[k.id].op.kind_name();
        s.push_str(&format!(
            "// ===== {} ({}, {}) grid {:?} block {:?}\n",
            k.name, kind, k.template, k.grid, k.block
        ));
        if seen.insert(kind) {
            let cut = k.source.find(PRELUDE_END).expect("prelude") + PRELUDE_END.len();
            prelude = k.source[..cut].to_string();
            s.push_str(&k.source[cut..]);
            s.push('\n');
        }
    }
    s.push_str("// ===== prelude of every kernel\n");
    s.push_str(&prelude);
    s
}

const PRELUDE_END: &str = "#define DMC_FRAC_1_SQRT_2PI 0.3989422804014327\n";

#[test]
fn every_example_kernel_renders_and_params_follow_the_signature() {
    for ex in EXAMPLES {
        for mode in [Mode::Train, Mode::Eval, Mode::Predict] {
            let plan = plan_of(ex, mode);
            let ks = render_plan(&plan, &CodegenOptions::default()).expect("renders");
            for k in &ks {
                let pk = &plan.kernels[k.id];
                assert_eq!(k.params, kernel_params(&pk.signature), "{}", k.name);
                let decls: Vec<&str> = k.params.iter().map(|p| p.decl.as_str()).collect();
                assert!(
                    k.source
                        .contains(&format!("{}({})", k.entry, decls.join(", "))),
                    "{}",
                    k.name
                );
                for (i, p) in pk.signature.params.iter().enumerate() {
                    assert_eq!(k.params[i].source, ArgSource::Buffer(i));
                    assert_eq!(k.params[i].name, p.name);
                }
                assert!(!k.source.contains("{{"), "{}: unrendered template", k.name);
            }
        }
    }
}

#[test]
fn no_transposed_weight_copy_in_backward_data() {
    let plan = plan_of("seed", Mode::Train);
    for k in render_plan(&plan, &CodegenOptions::default()).unwrap() {
        if k.template == "conv2d_bwd_data.cu.tera" {
            // one parameter per signature slot + seed, step, lr: dy, w, dx and the split-K
            // partial sums; no transposed weight
            let names: Vec<&str> = k.params.iter().map(|p| p.name.as_str()).collect();
            assert_eq!(names, ["dy", "w", "dx", "partial", "seed", "step", "lr"]);
        }
    }
}

#[test]
fn snapshots() {
    for ex in EXAMPLES {
        let plan = plan_of(ex, Mode::Train);
        insta::assert_snapshot!(format!("cuda_{ex}"), combined(&plan));
    }
}
