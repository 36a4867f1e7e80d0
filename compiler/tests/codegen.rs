//! CUDA code generation: every kernel of every example renders, and the generated sources are
//! pinned by snapshots (one combined snapshot per example and mode).

use dmc_compiler::codegen::{kernel_params, render_plan, ArgSource};
use dmc_compiler::plan::{Mode, Plan};
use dmc_compiler::CompileOptions;

fn plan_of(example: &str, mode: Mode) -> Plan {
    let path = format!("{}/../examples/{example}.dm", env!("CARGO_MANIFEST_DIR"));
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
    for k in render_plan(plan).expect("renders") {
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
            let ks = render_plan(&plan).expect("renders");
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
    for k in render_plan(&plan).unwrap() {
        if k.template == "conv2d_bwd_data.cu.tera" {
            // one parameter per signature slot + seed + step: dy, w, dx; nothing else
            assert_eq!(k.params.len(), 5);
        }
    }
}

#[test]
fn the_zoo_covers_every_kernel_op_and_renders() {
    use dmc_compiler::codegen::{render_kernel, zoo::zoo};
    let kinds: std::collections::BTreeSet<&str> = zoo().iter().map(|k| k.op.kind_name()).collect();
    // every Op variant but the 3 leaves and Reshape (a unary kind per activation)
    assert_eq!(kinds.len(), 44, "{kinds:?}");
    let mut s = String::new();
    for k in zoo() {
        let c = render_kernel(&k, Mode::Train)
            .unwrap()
            .expect("has a kernel");
        assert_eq!(c.params, kernel_params(&k.signature));
        s.push_str(&format!(
            "// ===== {} ({}) grid {:?} block {:?}\n",
            c.name, c.template, c.grid, c.block
        ));
        let cut = c.source.find(PRELUDE_END).unwrap() + PRELUDE_END.len();
        s.push_str(&c.source[cut..]);
    }
    insta::assert_snapshot!("cuda_zoo", s);
}

#[test]
fn snapshots() {
    for ex in EXAMPLES {
        let plan = plan_of(ex, Mode::Train);
        insta::assert_snapshot!(format!("cuda_{ex}"), combined(&plan));
    }
}

#[test]
fn split_k_kernels_have_a_reduce_launch_and_fit_their_workspace() {
    use dmc_compiler::codegen::{render_kernel, split_k, zoo::zoo};
    let mut split = Vec::new();
    for k in zoo() {
        let c = render_kernel(&k, Mode::Train).unwrap().expect("kernel");
        let Some(then) = &c.then else { continue };
        let s = c.grid[2] as usize;
        assert!(s > 1, "{}: a reduce launch without a split", c.name);
        assert_eq!(then.entry, format!("{}_reduce", c.entry));
        assert!(c
            .source
            .contains(&format!("void __launch_bounds__(256) {}(", then.entry)));
        // the partial sums (s x gm x gn) fit the workspace they are written to
        let ws = k
            .signature
            .params
            .iter()
            .zip(&k.arg_shapes)
            .filter(|(p, _)| p.role == dmc_compiler::op::Role::Workspace)
            .map(|(_, s)| s.iter().product::<usize>())
            .max()
            .unwrap();
        let def = |name: &str| -> usize {
            let at = c.source.find(&format!("#define {name} ")).expect(name) + name.len() + 9;
            c.source[at..]
                .split("LL")
                .next()
                .unwrap()
                .trim()
                .parse()
                .expect(name)
        };
        let (gm, gn) = (def("GM"), def("GN"));
        assert!(ws >= s * gm * gn, "{}: {s} x {gm} x {gn} > {ws}", c.name);
        assert_eq!(then.grid[0] as usize, (gm * gn).div_ceil(256), "{}", c.name);
        split.push((k.op.kind_name(), s));
    }
    let kinds: std::collections::BTreeSet<_> = split.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        ["conv2d", "conv2d_bwd_weight", "conv2d_bwd_weight_update"],
        "{split:?}"
    );
    // the policy: no split for a big grid or a short reduction, bounded by the workspace
    assert_eq!(split_k(4096, 4096, 1 << 20, usize::MAX), 1);
    assert_eq!(split_k(16, 16, 100, usize::MAX), 1);
    assert_eq!(split_k(16, 1024, 9216, 16 * 1024 * 3), 3);
}
