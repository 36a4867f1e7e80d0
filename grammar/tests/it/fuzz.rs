//! Robustness: 160,000 random and mutated programs through parse + check + render.
//! Nothing may panic or hang, and every error span lies within the input on char boundaries.

use dmc_grammar::{compile_source, render_plain};
use proptest::prelude::*;

const EXAMPLES: [&str; 4] = [
    include_str!("../../../examples/seed.dm"),
    include_str!("../../../examples/mlp.dm"),
    include_str!("../../../examples/resnet_small.dm"),
    include_str!("../../../examples/deep_convnet.dm"),
];

/// The examples, and variants that stress the reader and the renderer: a byte-order mark, lines
/// longer than the rendered window, CRLF and lone CR line ends, the loss above its prediction.
fn seeds() -> &'static [String] {
    static SEEDS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    SEEDS.get_or_init(|| {
        let mut v: Vec<String> = EXAMPLES.iter().map(|s| s.to_string()).collect();
        v.push(format!("\u{feff}{}", EXAMPLES[1]));
        v.push(EXAMPLES[1].replace(
            "  |> dense(10) as classifier",
            &format!(
                "{}|> dense(10) as classifier # {}",
                " ".repeat(300),
                "c".repeat(300)
            ),
        ));
        v.push(EXAMPLES[3].replace('\n', "\r\n").replacen("\r\n", "\r", 3));
        let loss = "loss cross_entropy(logits, label)\n";
        v.push(format!("{loss}{}", EXAMPLES[2].replace(loss, "")));
        v
    })
}

/// Tokens before the layer names (see [`tokens`]).
const TOKENS_BEFORE: &[&str] = &[
    "input", "target", "block", "return", "loss", "train", "repeat", "as", "int", "x", "y", "out",
    "h", "label", "c",
];

/// Tokens after the layer names (see [`tokens`]).
const TOKENS_AFTER: &[&str] = &[
    "mse",
    "cross_entropy",
    "sgd",
    "adam",
    "adamw",
    "batch",
    "optimizer",
    "epochs",
    "seed",
    "lr",
    "momentum",
    "betas",
    "padding",
    "same",
    "valid",
    "activation",
    "stride",
    "bias",
    "true",
    "false",
    "|>",
    "+",
    "*",
    "concat",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    "=",
    "-",
    ";",
    "\n",
    " ",
    "#",
    "0",
    "1",
    "2",
    "3",
    "16",
    "1024",
    "0.5",
    "1e-3",
    "-1",
    "99999999999",
    "1e400",
    "é",
    "€",
    "🦀",
    "|",
    ".",
    "\"",
];

/// Tokens the mutations insert and the random programs are made of: keywords and names, every
/// layer of the grammar's table, other words, punctuation and numbers.
fn tokens() -> &'static [&'static str] {
    static TOKENS: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    TOKENS.get_or_init(|| {
        let mut t = TOKENS_BEFORE.to_vec();
        t.extend(dmc_grammar::layers::names());
        t.extend(TOKENS_AFTER);
        t
    })
}

fn check(src: &str) -> Result<(), TestCaseError> {
    match compile_source(src, "fuzz.dm") {
        Ok(m) => {
            prop_assert!(!m.nodes.is_empty());
            prop_assert!(m.train.batch >= 1);
            prop_assert!(dmc_grammar::summary_text(&m).contains("Total params"));
            prop_assert!(dmc_grammar::summary_json(&m)["layers"].is_array());
        }
        Err(d) => {
            prop_assert!(d.span.start <= d.span.end, "span {:?}", d.span);
            prop_assert!(
                d.span.end <= src.len(),
                "span {:?} len {}",
                d.span,
                src.len()
            );
            prop_assert!(src.is_char_boundary(d.span.start) && src.is_char_boundary(d.span.end));
            for (s, _) in &d.notes {
                prop_assert!(s.start <= s.end && s.end <= src.len());
            }
            prop_assert!(d.line >= 1 && d.col >= 1);
            let text = render_plain(&d);
            let at = format!("fuzz.dm:{}:{}", d.line, d.col);
            prop_assert!(text.contains(&at), "no {} in\n{}", at, text);
            let words = |t: &str| {
                t.chars()
                    .filter(|c| !c.is_whitespace() && *c != '│')
                    .collect::<String>()
            };
            prop_assert!(words(&text).contains(&words(&d.message)), "{}", text);
        }
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum Mutation {
    DeleteChars(usize, usize),
    InsertToken(usize, usize),
    SwapChars(usize, usize),
    SwapTokens(usize, usize),
    Truncate(usize),
    Duplicate(usize, usize),
    ReplaceNumber(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1usize..8).prop_map(|(a, n)| Mutation::DeleteChars(a, n)),
        (any::<usize>(), any::<usize>()).prop_map(|(a, t)| Mutation::InsertToken(a, t)),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::SwapChars(a, b)),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::SwapTokens(a, b)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), 1usize..40).prop_map(|(a, n)| Mutation::Duplicate(a, n)),
        (any::<usize>(), any::<usize>()).prop_map(|(a, t)| Mutation::ReplaceNumber(a, t)),
    ]
}

/// Splits into word-ish pieces (keeping separators) for token-level mutations.
fn pieces(s: &str) -> Vec<String> {
    let mut out: Vec<String> = vec![];
    let mut cur = String::new();
    for c in s.chars() {
        if c.is_alphanumeric() || c == '_' || c == '.' {
            cur.push(c);
        } else {
            if !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
            out.push(c.to_string());
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn apply(src: &str, m: &Mutation) -> String {
    let mut chars: Vec<char> = src.chars().collect();
    let n = chars.len().max(1);
    match *m {
        Mutation::DeleteChars(a, k) => {
            let a = a % n;
            let b = (a + k).min(chars.len());
            if a < b {
                chars.drain(a..b);
            }
        }
        Mutation::InsertToken(a, t) => {
            let a = a % (chars.len() + 1);
            let tok = tokens()[t % tokens().len()];
            for (i, c) in tok.chars().enumerate() {
                chars.insert(a + i, c);
            }
        }
        Mutation::SwapChars(a, b) => {
            if !chars.is_empty() {
                let l = chars.len();
                chars.swap(a % l, b % l);
            }
        }
        Mutation::SwapTokens(a, b) => {
            let mut p = pieces(src);
            if !p.is_empty() {
                let l = p.len();
                p.swap(a % l, b % l);
            }
            return p.concat();
        }
        Mutation::Truncate(a) => chars.truncate(a % n),
        Mutation::Duplicate(a, k) => {
            let a = a % n;
            let b = (a + k).min(chars.len());
            if a < b {
                let seg: Vec<char> = chars[a..b].to_vec();
                for (i, c) in seg.into_iter().enumerate() {
                    chars.insert(b + i, c);
                }
            }
        }
        Mutation::ReplaceNumber(a, t) => {
            let mut p = pieces(src);
            let nums: Vec<usize> = (0..p.len())
                .filter(|i| p[*i].starts_with(|c: char| c.is_ascii_digit()))
                .collect();
            if !nums.is_empty() {
                let i = nums[a % nums.len()];
                p[i] = [
                    "0",
                    "-3",
                    "1",
                    "2",
                    "7",
                    "33",
                    "100000",
                    "4294967296",
                    "1.5",
                    "0.0",
                ][t % 10]
                    .to_string();
            }
            return p.concat();
        }
    }
    chars.into_iter().collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 80_000, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn mutated_examples(ex in 0usize..8, muts in prop::collection::vec(mutation(), 1..5)) {
        let mut src = seeds()[ex].clone();
        for m in &muts {
            src = apply(&src, m);
        }
        check(&src)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40_000, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn token_soup(toks in prop::collection::vec(0usize..tokens().len(), 0..60)) {
        let src: Vec<&str> = toks.iter().map(|t| tokens()[*t]).collect();
        check(&src.join(" "))?;
        check(&src.concat())?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 20_000, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn arbitrary_text(s in "\\PC{0,80}") {
        check(&s)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3_000, failure_persistence: None, ..ProptestConfig::default() })]
    /// A token (often an error) far right on a long line, or inside a long name.
    #[test]
    fn long_lines_and_names(ex in 0usize..8, at in any::<usize>(), pad in 0usize..3_000, tok in 0usize..tokens().len(), name in any::<bool>()) {
        let src = &seeds()[ex];
        let mut chars: Vec<char> = src.chars().collect();
        let at = at % (chars.len() + 1);
        let filler = if name { 'n' } else { ' ' };
        let ins = filler.to_string().repeat(pad) + tokens()[tok];
        chars.splice(at..at, ins.chars());
        check(&chars.into_iter().collect::<String>())?;
    }
}

#[test]
fn long_chains_and_deep_blocks_do_not_overflow() {
    let stages = "|> relu ".repeat(50_000);
    let src = format!("input x: [4]\ntarget y: [4]\nout = x {stages} |> dense(4)\nloss mse(out, y)\ntrain {{ batch: 1, optimizer: sgd }}");
    let m = compile_source(&src, "long.dm").expect("a long pipeline is fine");
    assert_eq!(m.nodes.len(), 50_001);
    let sum = vec!["x"; 20_000].join(" + ");
    let src = format!("input x: [4]\ntarget y: [4]\nout = {sum} |> dense(4)\nloss mse(out, y)\ntrain {{ batch: 1, optimizer: sgd }}");
    assert_eq!(
        compile_source(&src, "sum.dm").map(|m| m.nodes.len()).ok(),
        Some(20_000)
    );
    // Nesting just under the parser's limit must not overflow the checker's stack either.
    let nested = format!("input x: [4]\ntarget y: [4]\nout = {}x{} |> dense(4)\nloss mse(out, y)\ntrain {{ batch: 1, optimizer: sgd }}", "relu(".repeat(60), ")".repeat(60));
    assert!(compile_source(&nested, "nested.dm").is_ok());
    let nested = format!("input x: [4]\ntarget y: [4]\nout = {}x{}\nloss mse(out, y)\ntrain {{ batch: 1, optimizer: sgd }}", "relu(".repeat(199), ")".repeat(199));
    let _ = compile_source(&nested, "nested.dm");
    // A chain of 500 blocks each using the next.
    let mut blocks = String::new();
    for i in 0..500 {
        blocks.push_str(&format!("block b{i}(x) {{ return x |> b{} }}\n", i + 1));
    }
    blocks.push_str("block b500(x) { return x |> relu }\n");
    let src = format!("input x: [4]\ntarget y: [4]\n{blocks}out = x |> b0\nloss mse(out, y)\ntrain {{ batch: 1, optimizer: sgd }}");
    let e = compile_source(&src, "chain.dm").expect_err("too deep");
    assert!(e.message.contains("nested too deeply"), "{}", e.message);
}

#[test]
fn deep_nesting_and_huge_repeat_do_not_hang() {
    let deep = format!(
        "input x: [4]\nout = {}x{}\n",
        "relu(".repeat(5000),
        ")".repeat(5000)
    );
    assert!(compile_source(&deep, "deep.dm").is_err());
    let parens = format!(
        "input x: [4]\nout = {}x{}\n",
        "(".repeat(100_000),
        ")".repeat(100_000)
    );
    assert!(compile_source(&parens, "p.dm").is_err());
    let big = "input x: [4]\ntarget y: [4]\nout = x |> repeat 1000000000 { repeat 1000000000 { relu } }\nloss mse(out, y)\ntrain { batch: 1, optimizer: sgd }";
    assert!(compile_source(big, "big.dm").is_err());
    let exp = "input x: [4]\ntarget y: [4]\nblock a(x) { return x |> relu |> relu }\nblock b(x) { return x |> a |> a }\nblock c(x) { return x |> b |> b }\nblock d(x) { return x |> c |> c }\nout = x |> repeat 100000 { d }\nloss mse(out, y)\ntrain { batch: 1, optimizer: sgd }";
    assert!(compile_source(exp, "exp.dm").is_err());
    let big_batch = "input x: [1099511627776]\ntarget y: [1]\nout = x |> dense(1)\nloss mse(out, y)\ntrain { batch: 2147483647, optimizer: sgd }";
    if let Ok(m) = compile_source(big_batch, "batch.dm") {
        assert!(dmc_grammar::summary_text(&m).contains("Total params"));
    }
    let huge = "input x: [2147483648, 2147483648, 2147483648]\ntarget y: [1]\nout = x |> flatten |> dense(1)\nloss mse(out, y)\ntrain { batch: 1, optimizer: sgd }";
    assert!(compile_source(huge, "huge.dm").is_err());
}

/// Numbers that stress the checker's arithmetic.
const NUMS: &[&str] = &[
    "0",
    "1",
    "2",
    "3",
    "4",
    "7",
    "16",
    "-1",
    "0.5",
    "1.0",
    "1e-3",
    "65536",
    "2147483647",
    "2147483648",
    "4294967296",
    "9223372036854775807",
    "1e300",
];

fn stage_text(op: usize, a: usize, b: usize, kw: usize) -> String {
    let n = |i: usize| NUMS[i % NUMS.len()];
    let kwarg = [
        "".to_string(),
        format!(", stride: {}", n(kw)),
        ", padding: valid".to_string(),
        ", activation: relu".to_string(),
        ", bias: false".to_string(),
        format!(", p: {}", n(kw)),
    ][kw % 6]
        .clone();
    match op % 14 {
        0 => format!("conv2d({}, {}{kwarg})", n(a), n(b)),
        1 => format!("maxpool({}{kwarg})", n(a)),
        2 => format!("avgpool({}, stride: {})", n(a), n(b)),
        3 => "global_avgpool".into(),
        4 => format!("dense({}{kwarg})", n(a)),
        5 => "flatten".into(),
        6 => "relu".into(),
        7 => format!("dropout({})", n(a)),
        8 => format!("repeat {} {{ dense({}) }}", n(a), n(b)),
        9 => format!("repeat {} {{ conv2d({}, 3) |> relu }}", n(a), n(b)),
        10 => "blk".into(),
        11 => format!("blk(c: {})", n(a)),
        12 => "add(x)".into(),
        _ => "tanh".into(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 20_000, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn structured_programs(
        dims in prop::collection::vec(0usize..NUMS.len(), 1..4),
        stages in prop::collection::vec((0usize..14, 0usize..40, 0usize..40, 0usize..12), 0..8),
        ce in any::<bool>(),
        batch in 0usize..NUMS.len(),
    ) {
        let dims: Vec<&str> = dims.iter().map(|d| NUMS[*d]).collect();
        let st: Vec<String> = stages.iter().map(|(o, a, b, k)| stage_text(*o, *a, *b, *k)).collect();
        let target = if ce { "int" } else { "[1]" };
        let loss = if ce { "cross_entropy" } else { "mse" };
        let src = format!(
            "input x: [{}]\ntarget y: {target}\nblock blk(x, c: 2) {{\n  h = x |> dense(c)\n  return h\n}}\nout = x |> {} |> flatten |> dense(1)\nloss {loss}(out, y)\ntrain {{ batch: {}, optimizer: sgd }}\n",
            dims.join(", "),
            if st.is_empty() { "relu".to_string() } else { st.join(" |> ") },
            NUMS[batch],
        );
        check(&src)?;
    }
}
