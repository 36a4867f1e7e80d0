//! Every error of a file in one run, without follow-on errors; meaning-preserving suggestions;
//! the block-scope error.

use dmc_grammar::{compile_source, render_plain, Diagnostic};

fn errors(src: &str) -> Diagnostic {
    match compile_source(src, "net.dm") {
        Ok(_) => panic!("compiled but should fail:\n{src}"),
        Err(d) => d,
    }
}

/// `(line, col, message)` of every error reported.
fn found(src: &str) -> Vec<(usize, usize, String)> {
    let d = errors(src);
    assert_eq!(d.more, 0);
    d.all()
        .map(|e| (e.line, e.col, e.message.clone()))
        .collect()
}

#[test]
fn three_independent_mistakes_three_errors() {
    let src = "input x: [16, 16, 1]\n\
               target y: [1]\n\
               a = x |> conv2d(8, 3, padding: sme)\n\
               b = x |> conv2(8, 3)\n\
               out = a + b |> flatten |> dense(1)\n\
               loss mse(out, y)\n\
               train { batch: 0, optimizer: sgd }\n";
    let errs = found(src);
    assert_eq!(errs.len(), 3, "{errs:#?}");
    assert_eq!((errs[0].0, errs[0].1), (3, 32));
    assert!(errs[0].2.contains("unknown padding `sme`"), "{errs:?}");
    assert_eq!((errs[1].0, errs[1].1), (4, 10));
    assert!(errs[1].2.contains("unknown operation `conv2`"), "{errs:?}");
    assert_eq!((errs[2].0, errs[2].1), (7, 16));
    assert!(errs[2].2.contains("`batch` must be at least 1"), "{errs:?}");

    let d = errors(src);
    assert_eq!(d.count(), 3);
    let text = render_plain(&d);
    for (l, c, m) in &errs {
        assert!(text.contains(&format!("net.dm:{l}:{c}")), "{text}");
        assert!(text.contains(m.as_str()), "{text}");
    }
    assert!(text.contains("did you mean `same`?"), "{text}");
    assert!(text.contains("did you mean `conv2d`?"), "{text}");
    assert!(text.trim_end().ends_with("3 errors in net.dm"), "{text}");
}

#[test]
fn a_bad_layer_is_reported_once_not_at_every_use() {
    // `h` is in error: its uses (a pipeline, a sum, the loss through `out`) are not reported.
    let src = "input x: [8, 8, 1]\n\
               target y: [1]\n\
               h = x |> conv2d(0, 3)\n\
               g = h |> relu\n\
               s = g + h\n\
               out = s |> flatten |> dense(1, activation: tanh)\n\
               loss mse(out, y)\n\
               train { batch: 4, optimizer: sgd }\n";
    let errs = found(src);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!((errs[0].0, errs[0].1), (3, 17));
    assert!(errs[0].2.contains("`filters` must be positive"), "{errs:?}");

    // A bad number value: its uses as arguments are not reported either.
    let src = "input x: [8]\ntarget y: [1]\nwidth = nope\nout = x |> dense(width) |> dense(1)\nloss mse(out, y)\ntrain { batch: 4, optimizer: sgd }\n";
    let errs = found(src);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(errs[0].2.contains("unknown name `nope`"), "{errs:?}");

    // A bad input declaration: every use of the input is quiet.
    let src = "input x: [8, 0]\ntarget y: [1]\nout = x |> flatten |> dense(1)\nloss mse(out, y)\ntrain { batch: 4, optimizer: sgd }\n";
    let errs = found(src);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(errs[0].2.contains("not positive"), "{errs:?}");
}

#[test]
fn an_error_in_a_block_is_reported_once_for_all_its_uses() {
    let src = "input x: [8, 8, 4]\n\
               target y: [1]\n\
               block b(x) {\n  h = x |> conv2d(4, 3, padding: sme)\n  return x + h\n}\n\
               out = x |> b |> repeat 3 { b } |> flatten |> dense(1)\n\
               loss mse(out, y)\n\
               train { batch: 4, optimizer: adma }\n";
    let errs = found(src);
    assert_eq!(errs.len(), 2, "{errs:#?}");
    assert_eq!((errs[0].0, errs[0].1), (4, 34));
    assert!(errs[1].2.contains("unknown optimizer `adma`"), "{errs:?}");
    let text = render_plain(&errors(src));
    assert!(text.contains("in this use of block `b`"), "{text}");
    assert!(text.contains("did you mean `adam`?"), "{text}");
}

#[test]
fn errors_beyond_the_limit_are_counted() {
    let mut src = String::from("input x: [4]\ntarget y: [1]\n");
    for i in 0..30 {
        src.push_str(&format!("v{i} = x |> dense(0)\n"));
    }
    src.push_str("out = x |> dense(1)\nloss mse(out, y)\ntrain { batch: 4, optimizer: sgd }\n");
    let d = errors(&src);
    assert_eq!(d.related.len() + 1, dmc_grammar::diag::MAX_SHOWN);
    assert_eq!(d.more, 10);
    assert_eq!(d.count(), 30);
    let lines: Vec<usize> = d.all().map(|e| e.line).collect();
    assert_eq!(lines, (3..23).collect::<Vec<_>>());
    let text = render_plain(&d);
    assert!(text.contains("... and 10 more errors"), "{text}");
    assert!(text.trim_end().ends_with("30 errors in net.dm"), "{text}");
}

#[test]
fn unsupported_names_are_not_corrected_to_other_names() {
    let wrap = |body: &str, loss: &str, opt: &str| {
        format!("input x: [4]\ntarget y: [1]\n{body}\nloss {loss}(out, y)\ntrain {{ batch: 4, optimizer: {opt} }}\n")
    };
    let cases = [
        (
            wrap("out = x |> selu |> dense(1)", "mse", "sgd"),
            "`selu` is not supported yet (supported activations: relu",
        ),
        (
            wrap("out = x |> dense(1, activation: selu)", "mse", "sgd"),
            "`selu` is not supported yet (supported activations: relu",
        ),
        (
            wrap("out = x |> dense(1)", "hinge", "sgd"),
            "`hinge` is not supported yet (supported losses: mse, cross_entropy, mae, huber, bce_with_logits)",
        ),
        (
            wrap("out = x |> dense(1)", "kl_div", "sgd"),
            "`kl_div` is not supported yet",
        ),
        (
            wrap("out = x |> groupnorm |> dense(1)", "mse", "sgd"),
            "`groupnorm` is not supported yet (supported operations: conv2d",
        ),
        (
            wrap("out = x |> prelu |> dense(1)", "mse", "sgd"),
            "`prelu` is not supported yet",
        ),
        (
            wrap("out = x |> dense(1)", "mse", "adagrad"),
            "`adagrad` is not supported yet (supported optimizers: sgd, adam, adamw, rmsprop, lion)",
        ),
    ];
    for (src, expected) in cases {
        let d = errors(&src);
        assert_eq!(d.count(), 1, "{src}");
        let help = d.help.clone().unwrap_or_default();
        assert!(help.starts_with(expected), "{src}\n{help}");
        let text = render_plain(&d);
        assert!(!text.contains("did you mean"), "{text}");
    }
}

#[test]
fn typos_get_the_right_suggestion() {
    let wrap = |body: &str, loss: &str, opt: &str| {
        format!("input x: [4]\ntarget y: [1]\n{body}\nloss {loss}(out, y)\ntrain {{ batch: 4, optimizer: {opt} }}\n")
    };
    let cases = [
        (
            wrap("out = x |> dens(1)", "mse", "sgd"),
            "did you mean `dense`?",
        ),
        (
            wrap("out = x |> rleu |> dense(1)", "mse", "sgd"),
            "did you mean `relu`?",
        ),
        (
            wrap("out = x |> dense(1, activation: rleu)", "mse", "sgd"),
            "did you mean `relu`?",
        ),
        (
            wrap("out = x |> dense(1)", "mes", "sgd"),
            "did you mean `mse`?",
        ),
        (
            wrap("out = x |> dense(1)", "mse", "adma"),
            "did you mean `adam`?",
        ),
        (
            wrap("out = x |> Dense(1)", "mse", "sgd"),
            "did you mean `dense`?",
        ),
        (
            wrap("out = x |> swish |> dense(1)", "mse", "sgd"),
            "did you mean `silu`?",
        ),
    ];
    for (src, expected) in cases {
        let d = errors(&src);
        assert_eq!(d.count(), 1, "{src}");
        let help = d.help.clone().unwrap_or_default();
        assert!(help.starts_with(expected), "{src}\n{help}");
    }
}

#[test]
fn a_top_level_value_used_in_a_block_is_not_visible_there() {
    let src = "input x: [4]\n\
               target y: [1]\n\
               w = 8\n\
               block wide(x) {\n  return x |> dense(w)\n}\n\
               out = x |> wide |> dense(1, activation: relu) |> dense(w) |> dense(1)\n\
               loss mse(out, y)\n\
               train { batch: 4, optimizer: sgd }\n";
    let d = errors(src);
    assert_eq!(d.count(), 1, "{}", render_plain(&d));
    assert_eq!(d.message, "`w` is not visible inside the block `wide`");
    assert_eq!((d.line, d.col), (5, 21));
    let help = d.help.clone().unwrap_or_default();
    assert!(
        help.contains("blocks see only their parameters and their own values"),
        "{help}"
    );
    assert!(help.contains("wide(..., w: w)"), "{help}");
    let text = render_plain(&d);
    assert!(!text.contains("whole number"), "{text}");
    assert!(
        text.contains("`w` is defined here, at the top level"),
        "{text}"
    );
    assert!(text.contains("in this use of block `wide`"), "{text}");

    // The fix the help describes compiles.
    let fixed = src
        .replace("block wide(x)", "block wide(x, w)")
        .replace("x |> wide |>", "x |> wide(w: w) |>");
    assert!(compile_source(&fixed, "net.dm").is_ok(), "{fixed}");
}

#[test]
fn an_unknown_name_as_a_number_argument_is_an_unknown_name() {
    let src = "input x: [4]\ntarget y: [1]\nwidth = 8\nout = x |> dense(widht) |> dense(1)\nloss mse(out, y)\ntrain { batch: 4, optimizer: sgd }\n";
    let d = errors(src);
    assert_eq!(d.count(), 1, "{}", render_plain(&d));
    assert_eq!(d.message, "unknown name `widht`");
    assert_eq!(d.help.as_deref(), Some("did you mean `width`?"));
}

#[test]
fn independent_block_and_statement_errors_together() {
    // A recursive block, a duplicate value and a missing train section: all three.
    let src = "input x: [4]\n\
               target y: [1]\n\
               block a(x) { return x |> a }\n\
               h = x |> dense(4)\n\
               h = x |> dense(4)\n\
               out = h |> a |> dense(1)\n\
               loss mse(out, y)\n";
    let errs = found(src);
    let msgs: Vec<&str> = errs.iter().map(|e| e.2.as_str()).collect();
    assert_eq!(errs.len(), 3, "{msgs:#?}");
    assert!(msgs[0].contains("block `a` calls itself"), "{msgs:?}");
    assert!(msgs[1].contains("`h` is already defined"), "{msgs:?}");
    assert!(msgs[2].contains("no `train"), "{msgs:?}");
}

#[test]
fn what_does_not_need_a_value_in_error_is_still_checked() {
    // `h` is in error; the later stages' own mistakes (an unsupported activation, an unknown
    // name in a sum) are reported, their shapes are not checked.
    let src = "input x: [8]\n\
               target y: [1]\n\
               h = x |> dense(0)\n\
               g = h |> relu |> dense(4, activation: selu) |> dense(4)\n\
               s = g + nope\n\
               k = dense(h, 2, bias: maybe)\n\
               out = s + k |> dense(1)\n\
               loss mse(out, y)\n\
               train { batch: 4, optimizer: sgd }\n";
    let errs = found(src);
    let at: Vec<(usize, usize)> = errs.iter().map(|e| (e.0, e.1)).collect();
    assert_eq!(at, [(3, 16), (4, 39), (5, 9), (6, 23)], "{errs:#?}");
    assert!(errs[1].2.contains("unknown activation `selu`"), "{errs:?}");
    assert!(errs[2].2.contains("unknown name `nope`"), "{errs:?}");
    assert!(
        errs[3].2.contains("`bias` must be `true` or `false`"),
        "{errs:?}"
    );
}

#[test]
fn a_block_used_on_a_value_in_error_is_still_checked() {
    let src = "input x: [28, 28, 1]\n\
               target label: int\n\
               w = 64\n\
               block res(x) {\n  h = x |> conv2d(w, 3)\n  return x + h\n}\n\
               h = x |> conv2d(16, 3, padding: sme) |> res\n\
               logits = h |> flatten |> dense(10)\n\
               loss cross_entropy(logits, label)\n\
               train { batch: 32, optimizer: adam }\n";
    let errs = found(src);
    let at: Vec<(usize, usize)> = errs.iter().map(|e| (e.0, e.1)).collect();
    assert_eq!(at, [(5, 19), (8, 33)], "{errs:#?}");
    assert_eq!(errs[0].2, "`w` is not visible inside the block `res`");
}

#[test]
fn syntax_errors_of_separate_statements_are_reported_together() {
    let src = "input x: [4]\n\
               target y: [1]\n\
               h = x |> dense(4\n\
               out = h |> 3\n\
               loss mse(out, y)\n\
               train { batch: 1, optimizer: sgd(lr: ) }\n";
    let d = errors(src);
    let kinds: Vec<&str> = d.all().map(|e| e.kind.code()).collect();
    assert_eq!(kinds, ["dmc::syntax"; 3], "{}", render_plain(&d));
    let lines: Vec<usize> = d.all().map(|e| e.line).collect();
    assert_eq!(lines, [3, 4, 6], "{}", render_plain(&d));

    // An error in a block whose body is not indented: its `return` and `}` are skipped, not
    // reported as statements.
    let src = "input x: [4]\n\
               target y: [1]\n\
               block b(x) {\nh = x |> dense(4\nreturn h\n}\n\
               out = x |> b |> dense(1 2)\n\
               loss mse(out, y)\n\
               train { batch: 1, optimizer: sgd }\n";
    let d = errors(src);
    let lines: Vec<usize> = d.all().map(|e| e.line).collect();
    assert_eq!(lines, [4, 7], "{}", render_plain(&d));

    // A lexical error ends the text: it is reported, not the syntax error it causes.
    let src = "input x: [4]\ntarget y: [1]\nh = x |> dense(4\nout = x |> dense(1 @\n";
    let d = errors(src);
    let msgs: Vec<&str> = d.all().map(|e| e.message.as_str()).collect();
    assert_eq!(d.count(), 2, "{msgs:?}");
    assert_eq!(
        d.all().map(|e| e.line).collect::<Vec<_>>(),
        [3, 4],
        "{msgs:?}"
    );
}

#[test]
fn checking_stops_after_many_errors_and_says_so() {
    let mut src = String::from("input x: [4]\ntarget y: [1]\n");
    for i in 0..3000 {
        src.push_str(&format!("v{i} = x |> dense(0)\n"));
    }
    src.push_str("out = x |> dense(1)\nloss mse(out, y)\ntrain { batch: 4, optimizer: sgd }\n");
    let d = errors(&src);
    assert_eq!(d.count(), dmc_grammar::diag::MAX_COLLECTED);
    let text = render_plain(&d);
    assert!(text.contains("... and at least 980 more errors"), "{text}");
    assert!(
        text.trim_end().ends_with("at least 1000 errors in net.dm"),
        "{text}"
    );
}
