//! The table of layers (`dmc_grammar::layers`): every entry is well formed, its example and a
//! minimal use of its signature check and build the layer it names, every `Layer` variant is built
//! by some entry, the language reference documents every signature, and the other spellings of
//! an entry are suggested as it.

use dmc_grammar::layers::args::{ArgDefault, ArgKind, ArgValue};
use dmc_grammar::layers::{self, Inputs, LayerDef};
use dmc_grammar::model::{Activation, Layer, Model};
use dmc_grammar::{compile_source, render_plain, summary};
use std::collections::BTreeSet;

/// `use_` (an expression on the input `x`) in a program that trains it, with `x` an image and,
/// if that fails to check, a flat vector, a sequence of vectors, integer tokens.
fn check_use(use_: &str) -> Result<Model, String> {
    let mut errors = vec![];
    for shape in ["[8, 8, 3]", "[8]", "[8, 4]", "int[8]"] {
        let src = format!(
            "input x: {shape}\ntarget y: [2]\nh = {use_}\nout = h |> flatten |> dense(2)\nloss mse(out, y)\ntrain {{ batch: 2, optimizer: sgd }}\n"
        );
        match compile_source(&src, "layer.dm") {
            Ok(m) => return Ok(m),
            Err(d) => errors.push(format!("{src}\n{}", render_plain(&d))),
        }
    }
    Err(errors.join("\n"))
}

/// A use of `def` giving each required argument a value of its kind.
fn minimal_use(def: &LayerDef) -> String {
    if def.inputs != Inputs::One {
        return format!("{}(x, x)", def.name);
    }
    let args: Vec<String> = def
        .params
        .iter()
        .filter(|p| p.default == ArgDefault::Required)
        .map(|p| match p.kind {
            ArgKind::Count => "2".to_string(),
            ArgKind::Natural => "1".to_string(),
            ArgKind::Pair => "(2, 1)".to_string(),
            ArgKind::Padding(options) => options[0].to_string(),
            ArgKind::Number => "0.5".to_string(),
            ArgKind::Flag => "true".to_string(),
            ArgKind::Choice(options) => options[0].to_string(),
            ArgKind::Activation => "relu".to_string(),
            ArgKind::Init => "he_normal".to_string(),
            ArgKind::Shape => "[-1]".to_string(),
            ArgKind::Value => "none".to_string(),
        })
        .collect();
    if args.is_empty() {
        format!("x |> {}", def.name)
    } else {
        format!("x |> {}({})", def.name, args.join(", "))
    }
}

/// The name of a `Layer` variant. The match is exhaustive: a new variant does not compile here
/// until it is named, and [`every_layer_variant_is_built_by_an_entry`] then needs an entry that
/// builds it.
fn variant(l: &Layer) -> String {
    match l {
        Layer::Conv2d { .. } => "Conv2d".into(),
        Layer::ConvTranspose2d { .. } => "ConvTranspose2d".into(),
        Layer::MaxPool { .. } => "MaxPool".into(),
        Layer::AvgPool { .. } => "AvgPool".into(),
        Layer::GlobalAvgPool => "GlobalAvgPool".into(),
        Layer::GlobalMaxPool => "GlobalMaxPool".into(),
        Layer::Upsample { .. } => "Upsample".into(),
        Layer::Dense { .. } => "Dense".into(),
        Layer::Flatten => "Flatten".into(),
        Layer::Reshape => "Reshape".into(),
        Layer::Act(a) => format!("Act({})", a.name()),
        Layer::Add => "Add".into(),
        Layer::Mul => "Mul".into(),
        Layer::Concat => "Concat".into(),
        Layer::Dropout { .. } => "Dropout".into(),
        Layer::Softmax => "Softmax".into(),
        Layer::BatchNorm { .. } => "BatchNorm".into(),
        Layer::LayerNorm { .. } => "LayerNorm".into(),
        Layer::Embedding { .. } => "Embedding".into(),
        Layer::PosEmbedding => "PosEmbedding".into(),
        Layer::Attention { .. } => "Attention".into(),
    }
}

/// Every variant [`variant`] names, activations from [`Activation::ALL`].
fn all_variants() -> BTreeSet<String> {
    let mut v: BTreeSet<String> = [
        "Conv2d",
        "ConvTranspose2d",
        "MaxPool",
        "AvgPool",
        "GlobalAvgPool",
        "GlobalMaxPool",
        "Upsample",
        "Dense",
        "Flatten",
        "Reshape",
        "Add",
        "Dropout",
        "Softmax",
        "BatchNorm",
        "LayerNorm",
        "Mul",
        "Concat",
        "Embedding",
        "PosEmbedding",
        "Attention",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(Activation::ALL.map(|a| format!("Act({})", a.name())));
    v
}

/// Checks `use_` of `def` and returns the variant of the layer it built, after checking that the
/// first node is `def`'s layer, named and typed from the table.
fn built_by(def: &LayerDef, use_: &str) -> String {
    let m =
        check_use(use_).unwrap_or_else(|e| panic!("`{}`: `{use_}` does not check:\n{e}", def.name));
    let n = &m.nodes[0];
    assert_eq!(
        layers::layer_name(&n.layer),
        def.name,
        "`{use_}` built {:?}, which `layer_name` does not give to `{}`",
        n.layer,
        def.name
    );
    assert_eq!(n.name, format!("{}_1", def.name), "`{use_}`");
    assert_eq!(summary::layer_type(&n.layer), def.summary, "`{use_}`");
    variant(&n.layer)
}

#[test]
fn every_example_and_minimal_use_checks_and_builds_its_layer() {
    for def in layers::layers() {
        built_by(def, &minimal_use(def));
        if let Some(ex) = def.example {
            assert!(
                ex.starts_with("x |> "),
                "`{}`'s example must be a stage applied to `x`: {ex}",
                def.name
            );
            built_by(def, ex);
        }
    }
}

#[test]
fn every_layer_variant_is_built_by_an_entry() {
    let built: BTreeSet<String> = layers::layers()
        .iter()
        .map(|d| built_by(d, &minimal_use(d)))
        .collect();
    assert_eq!(built, all_variants());
}

#[test]
fn entries_are_well_formed() {
    let mut names = BTreeSet::new();
    for def in layers::layers() {
        let n = def.name;
        assert!(names.insert(n), "`{n}` is in the table twice");
        assert!(
            !n.is_empty()
                && n.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
            "`{n}` is not a lower-case name"
        );
        assert!(!def.doc.trim().is_empty(), "`{n}` has no doc line");
        assert!(!def.doc.contains('\n'), "`{n}`'s doc is more than one line");
        assert!(!def.summary.is_empty(), "`{n}` has no summary type name");
        assert_eq!(layers::find(n).map(|d| d.name), Some(n));
        let required = def.params.iter().any(|p| p.default == ArgDefault::Required);
        assert!(
            !required || def.example.is_some(),
            "`{n}` has a required argument but no example for the error that says it is missing"
        );
        if def.inputs != Inputs::One {
            assert!(def.params.is_empty(), "`{n}` takes values only");
        }
        let mut seen: Vec<&str> = vec![];
        for p in def.params {
            assert!(
                !seen.contains(&p.name),
                "`{n}`: argument `{}` twice",
                p.name
            );
            match (p.kind, p.default) {
                (_, ArgDefault::Required) => {}
                (_, ArgDefault::SameAs(other)) => {
                    let o = def.params.iter().find(|q| q.name == other);
                    assert!(
                        seen.contains(&other) && o.map(|q| q.kind) == Some(p.kind),
                        "`{n}`: `{}` defaults to `{other}`, which is not an earlier argument of its kind",
                        p.name
                    );
                }
                (ArgKind::Count, ArgDefault::Value(ArgValue::Count(v))) => assert!(v >= 1),
                (ArgKind::Natural, ArgDefault::Value(ArgValue::Natural(_))) => {}
                (ArgKind::Pair, ArgDefault::Value(ArgValue::Pair(a, b))) => {
                    assert!(a >= 1 && b >= 1)
                }
                (ArgKind::Padding(_), ArgDefault::Value(ArgValue::Padding(_))) => {}
                (ArgKind::Number, ArgDefault::Value(ArgValue::Number(_))) => {}
                (ArgKind::Flag, ArgDefault::Value(ArgValue::Flag(_))) => {}
                (ArgKind::Choice(options), ArgDefault::Value(ArgValue::Choice(c))) => {
                    assert!(
                        options.contains(&c),
                        "`{n}`: default `{c}` is not an option"
                    )
                }
                (ArgKind::Activation, ArgDefault::Value(ArgValue::Activation(_))) => {}
                (ArgKind::Init, ArgDefault::Value(ArgValue::Init(_))) => {}
                (ArgKind::Value, ArgDefault::Value(ArgValue::Value(None))) => {}
                (k, d) => panic!(
                    "`{n}`: argument `{}` of kind {k:?} has default {d:?}",
                    p.name
                ),
            }
            seen.push(p.name);
        }
    }
    for def in layers::layers() {
        for a in def.aliases {
            assert!(
                a.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()),
                "alias `{a}` of `{}` must be lower case without `_`",
                def.name
            );
            assert!(layers::find(a).is_none(), "alias `{a}` is a layer's name");
            let owners = layers::layers()
                .iter()
                .filter(|d| d.aliases.contains(a))
                .count();
            assert_eq!(owners, 1, "alias `{a}` belongs to {owners} entries");
        }
    }
}

#[test]
fn the_language_reference_documents_every_signature() {
    let path = format!("{}/../docs/LANGUAGE.md", env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let ops = doc
        .split("## 7. Operations")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .unwrap_or_else(|| panic!("{path} has no section `## 7. Operations`"));
    for def in layers::layers() {
        let sig = def.signature_text();
        assert!(
            ops.contains(&format!("`{sig}`")),
            "docs/LANGUAGE.md's operations table does not give `{sig}`"
        );
    }
}

#[test]
fn other_spellings_are_suggested_as_their_layer() {
    for def in layers::layers() {
        for a in def.aliases {
            let err = check_use(&format!("x |> {a}"))
                .err()
                .unwrap_or_else(|| panic!("`{a}` checked"));
            assert!(
                err.contains(&format!("unknown operation `{a}`"))
                    && err.contains(&format!("did you mean `{}`?", def.name)),
                "`{a}`:\n{err}"
            );
        }
    }
}
