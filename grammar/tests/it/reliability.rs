//! The front end on hostile input: very long lines and names, huge and unreadable files, byte-order
//! marks, invalid UTF-8, and values used before their definition.

use dmc_grammar::{
    compile_source, parse_source, read_source, read_source_limited, render_plain, summary_text,
    Diagnostic, Kind, MAX_SOURCE_BYTES,
};
use std::time::{Duration, Instant};

const HEAD: &str = "input x: [4]\ntarget y: [1]\n";
const TAIL: &str = "loss mse(out, y)\ntrain { batch: 1, optimizer: sgd }\n";

fn fail(src: &str) -> Diagnostic {
    match compile_source(src, "bad.dm") {
        Ok(_) => panic!("expected an error for:\n{}", &src[..src.len().min(300)]),
        Err(d) => d,
    }
}

/// Renders and checks the parts every report must have: `file:line:col`, the message, no panic.
fn rendered(d: &Diagnostic) -> String {
    let text = render_plain(d);
    assert!(
        text.contains(&format!("{}:{}:{}", d.file, d.line, d.col)),
        "no file:line:col in\n{text}"
    );
    // The message may be wrapped.
    let words = |t: &str| {
        t.chars()
            .filter(|c| !c.is_whitespace() && *c != '│')
            .collect::<String>()
    };
    assert!(
        words(&text).contains(&words(&d.message)),
        "no message in\n{text}"
    );
    text
}

#[test]
fn an_error_far_right_on_a_long_line_is_rendered_as_a_window() {
    for col in [70_000usize, 200_000] {
        // `out = x` then spaces, then an unknown operation starting at column `col` of line 3.
        let pad = " ".repeat(col - "out = x |> ".len() - 1);
        let src = format!("{HEAD}out = x |>{pad} bogus(1)\n{TAIL}");
        let d = fail(&src);
        assert_eq!((d.line, d.col), (3, col), "{}", d.message);
        assert!(d.message.contains("bogus"), "{}", d.message);
        let text = rendered(&d);
        assert!(text.contains(&format!("bad.dm:3:{col}")), "{text}");
        // A window around the error, not the whole line.
        assert!(text.contains("bogus(1)") && text.contains('…'), "{text}");
        assert!(text.len() < 4_000, "{} bytes:\n{text}", text.len());
        let underlined = text.lines().any(|l| l.contains('┬'));
        assert!(underlined, "{text}");
    }
}

#[test]
fn a_70000_character_layer_name_does_not_break_diagnostics_or_the_summary() {
    let name = "n".repeat(70_000);
    // Used twice: a duplicate layer name whose span is 70,000 characters long.
    let src = format!("{HEAD}out = x |> dense(4) as {name} |> dense(1) as {name}\n{TAIL}");
    let d = fail(&src);
    assert_eq!(d.kind, Kind::Name);
    assert_eq!(d.line, 3);
    let text = rendered(&d);
    assert!(text.len() < 4_000, "{} bytes:\n{text}", text.len());
    assert!(text.contains("duplicate layer name `nnnn"), "{text}");
    assert!(text.contains('…'), "{text}");

    // A valid program with that name: the summary table shortens it; the JSON keeps it whole.
    let src = format!("{HEAD}out = x |> dense(4) as {name} |> dense(1)\n{TAIL}");
    let m = compile_source(&src, "long.dm").expect("a long name is valid");
    let table = summary_text(&m);
    assert!(table.contains("Total params"), "{table}");
    assert!(table.len() < 4_000, "{} bytes", table.len());
    let shown = format!("{}…{} (Dense)", "n".repeat(40), "n".repeat(19));
    assert!(table.contains(&shown), "{table}");
    let json = dmc_grammar::summary_json(&m);
    assert_eq!(
        json["layers"][0]["name"].as_str().map(str::len),
        Some(70_000)
    );
}

#[test]
fn long_lines_elsewhere_are_cut_and_notes_keep_their_place() {
    // A note (the first definition) far right on line 3, the error at the start of line 4.
    let pad = " ".repeat(100_000);
    let src = format!("{HEAD}{pad}h = x |> relu\nh = x |> relu\nout = h |> dense(1)\n{TAIL}");
    let d = fail(&src);
    assert_eq!((d.line, d.col), (4, 1));
    let text = rendered(&d);
    assert!(text.contains("first defined here"), "{text}");
    assert!(text.len() < 4_000, "{} bytes:\n{text}", text.len());
    // A long comment line next to the error is shown as context, cut.
    let src = format!("{HEAD}# {}\nout = x |> bogus\n{TAIL}", "c".repeat(300_000));
    let d = fail(&src);
    assert_eq!((d.line, d.col), (4, 12));
    let text = rendered(&d);
    assert!(text.contains("# ccc"), "{text}");
    assert!(text.len() < 4_000, "{} bytes:\n{text}", text.len());
}

#[test]
fn long_words_in_messages_are_shortened() {
    let name = "q".repeat(5_000);
    let d = fail(&format!("{HEAD}out = x |> {name}(1)\n{TAIL}"));
    assert!(d.message.contains('…'), "{}", d.message);
    assert!(d.message.len() < 300, "{}", d.message);
    rendered(&d);
}

#[test]
fn the_parser_stops_at_the_first_error() {
    // A syntax error at token 1 comes before a lexical error further on: the lexer never got there.
    let d = fail("input = 3\n$ $ $\n");
    assert!(d.message.contains("reserved word"), "{}", d.message);
    assert_eq!((d.line, d.col), (1, 1));
    // A lexical error that the parser reaches is reported as such.
    let d = fail("input x: [4] $\n");
    assert!(
        d.message.contains("unexpected character `$`"),
        "{}",
        d.message
    );
    assert_eq!((d.line, d.col), (1, 14));
    // 64 MiB after an error at token 2 are not tokenised (the whole-file lexer took seconds here
    // and gigabytes of tokens).
    let mut src = String::from("input $ ");
    src.push_str(&"a ".repeat(32 << 20));
    let t = Instant::now();
    let d = fail(&src);
    assert!(
        d.message.contains("unexpected character `$`"),
        "{}",
        d.message
    );
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "took {:?}",
        t.elapsed()
    );
    // The lexer itself is lazy.
    let toks: Vec<_> = dmc_grammar::parser::Lexer::new(&src).take(3).collect();
    assert_eq!(toks.len(), 2, "stops after the error: {toks:?}");
    assert!(toks[1].is_err());
}

#[test]
fn a_byte_order_mark_is_skipped_and_columns_stay_right() {
    let ok = format!("\u{feff}{HEAD}out = x |> dense(1)\n{TAIL}");
    assert!(compile_source(&ok, "bom.dm").is_ok());
    assert!(parse_source(&ok, "bom.dm").is_ok());
    // An error on the first line: column 7 as an editor shows it (the mark is not a column).
    let d = fail("\u{feff}input x [4]\n");
    assert_eq!((d.line, d.col), (1, 9), "{}", d.message);
    let text = rendered(&d);
    assert!(text.contains("bad.dm:1:9"), "{text}");
    assert!(!text.contains('\u{feff}'), "{text:?}");
    assert!(text.contains(" 1 │ input x [4]"), "{text}");
    let d = fail(&format!("\u{feff}{HEAD}out = x |> bogus\n{TAIL}"));
    assert_eq!((d.line, d.col), (3, 12));
    assert!(rendered(&d).contains("bad.dm:3:12"));
    // Only at the very start.
    let d = fail(&format!("{HEAD}\u{feff}out = x |> dense(1)\n{TAIL}"));
    assert!(d.message.contains("unexpected character"), "{}", d.message);
    assert_eq!((d.line, d.col), (3, 1));
}

#[test]
fn a_lone_carriage_return_does_not_shift_line_numbers() {
    let d = fail("input x: [4]\r\ntarget y: [1]\rout = x |> bogus\n");
    assert_eq!((d.line, d.col), (2, 26));
    let text = rendered(&d);
    assert!(
        text.contains(" 2 │ target y: [1] out = x |> bogus"),
        "{text}"
    );
}

fn temp() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// A problem with the whole file: one line naming the file, and a help.
fn one_line(d: &Diagnostic) -> String {
    let text = render_plain(d);
    assert!(
        text.starts_with(&format!("error: {}\n  help: ", d.message)),
        "{text}"
    );
    assert!(d.message.contains(&d.file), "{text}");
    text
}

#[test]
fn reading_files_is_bounded_and_explained() {
    let dir = temp();
    // A directory.
    let d = read_source(dir.path()).expect_err("a directory");
    assert_eq!(d.kind, Kind::File);
    assert!(d.message.contains("is a directory"), "{}", d.message);
    one_line(&d);
    // A missing file.
    let missing = dir.path().join("missing.dm");
    let d = read_source(&missing).expect_err("missing");
    assert!(d.message.contains("cannot read"), "{}", d.message);
    one_line(&d);
    // A regular file one byte over the limit (sparse: nothing is written) is refused by its size.
    let big = dir.path().join("big.dm");
    let f = std::fs::File::create(&big).expect("create");
    f.set_len(MAX_SOURCE_BYTES + 1).expect("set_len");
    let d = read_source(&big).expect_err("too large");
    assert!(
        d.message.contains("too large (16,777,217 bytes)")
            && d.message.contains("at most 16,777,216 bytes (16 MiB)"),
        "{}",
        d.message
    );
    one_line(&d);
    // Exactly at the limit is read.
    f.set_len(MAX_SOURCE_BYTES).expect("set_len");
    let d = dmc_grammar::compile_file(&big).expect_err("zeros are no program");
    assert!(d.message.contains("unexpected character"), "{}", d.message);
    // A small limit, for the message without a known size.
    let small = dir.path().join("small.dm");
    std::fs::write(&small, "input x: [4]\n").expect("write");
    let d = read_source_limited(&small, 5).expect_err("over 5 bytes");
    assert!(d.message.contains("too large (13 bytes)"), "{}", d.message);
    assert_eq!(
        read_source_limited(&small, 13).ok().as_deref(),
        Some("input x: [4]\n")
    );
}

#[cfg(unix)]
#[test]
fn endless_devices_are_read_only_up_to_the_limit() {
    let zero = std::path::Path::new("/dev/zero");
    if !zero.exists() {
        return;
    }
    let t = Instant::now();
    let d = read_source(zero).expect_err("endless");
    assert_eq!(d.kind, Kind::File);
    assert!(
        d.message.contains(
            "too large (more than 16,777,216 bytes); a .dm program is at most 16,777,216 bytes"
        ),
        "{}",
        d.message
    );
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    one_line(&d);
    let d = dmc_grammar::compile_file(zero).expect_err("endless");
    assert!(d.message.contains("too large"), "{}", d.message);
}

#[test]
fn invalid_utf8_is_reported_at_its_line_and_column() {
    let dir = temp();
    let p = dir.path().join("latin1.dm");
    std::fs::write(&p, b"input x: [4]\ntarget y\xe9: [1]\n").expect("write");
    let d = read_source(&p).expect_err("not UTF-8");
    assert_eq!(d.kind, Kind::File);
    assert_eq!((d.line, d.col), (2, 9));
    assert!(
        d.message
            .contains("not valid UTF-8 (byte 0xE9 at 2:9, byte offset 21)"),
        "{}",
        d.message
    );
    assert_eq!(
        d.help.as_deref(),
        Some("save the file as UTF-8 (a .dm program is plain text)")
    );
    let text = rendered(&d);
    assert!(text.contains(&format!("{}:2:9", p.display())), "{text}");
    assert!(text.contains("not UTF-8"), "{text}");
    // Through compile_file as well, and a truncated multi-byte character at the very end.
    std::fs::write(&p, b"input x: [4]\xc3").expect("write");
    let d = dmc_grammar::compile_file(&p).expect_err("not UTF-8");
    assert_eq!((d.line, d.col), (1, 13));
    rendered(&d);
}

// --- values are defined before they are used ---

#[test]
fn the_loss_cannot_use_a_value_defined_below_it() {
    let d = fail(&format!(
        "{HEAD}loss mse(out, y)\nout = x |> dense(1)\ntrain {{ batch: 1, optimizer: sgd }}\n"
    ));
    assert_eq!(d.kind, Kind::Name);
    assert_eq!(d.message, "`out` is used before it is defined");
    assert_eq!((d.line, d.col), (3, 10));
    assert_eq!(d.notes.len(), 1);
    assert!(d.notes[0].1.contains("defined here"));
    assert!(d
        .help
        .as_deref()
        .unwrap_or("")
        .contains("move the definition of `out` above"));
    rendered(&d);
    // The target too.
    let d = fail(
        "input x: [4]\nout = x |> dense(1)\nloss mse(out, y)\ntarget y: [1]\ntrain { batch: 1, optimizer: sgd }\n",
    );
    assert_eq!(d.message, "`y` is used before it is defined");
    assert_eq!((d.line, d.col), (3, 15));
    // The train section may come anywhere: it names no values.
    let ok = "train { batch: 1, optimizer: sgd }\ninput x: [4]\ntarget y: [1]\nout = x |> dense(1)\nloss mse(out, y)\n";
    assert!(compile_source(ok, "ok.dm").is_ok());
}

#[test]
fn values_inputs_block_values_and_parameters_are_defined_before_use() {
    let d = fail(&format!("{HEAD}out = h |> dense(1)\nh = x |> relu\n{TAIL}"));
    assert_eq!(d.message, "`h` is used before it is defined");
    let d = fail("out = x |> dense(1)\ninput x: [4]\ntarget y: [1]\nloss mse(out, y)\ntrain { batch: 1, optimizer: sgd }\n");
    assert_eq!(d.message, "`x` is used before it is defined");
    assert_eq!((d.line, d.col), (1, 7));
    // A number used as an argument before its definition.
    let d = fail(&format!("{HEAD}out = x |> dense(w)\nw = 1\n{TAIL}"));
    assert_eq!(d.message, "`w` is used before it is defined");
    // Inside a block.
    let d = fail(&format!(
        "{HEAD}block b(x) {{\n  a = c |> relu\n  c = x |> relu\n  return a\n}}\nout = x |> b |> dense(1)\n{TAIL}"
    ));
    assert_eq!(d.message, "`c` is used before it is defined");
    assert_eq!((d.line, d.col), (4, 7));
    // A parameter's default may use the parameters before it, not after it.
    let ok = format!(
        "{HEAD}block b(x, n: 2, m: n) {{ return x |> dense(m) }}\nout = x |> b |> dense(1)\n{TAIL}"
    );
    assert!(compile_source(&ok, "ok.dm").is_ok());
    let d = fail(&format!(
        "{HEAD}block b(x, m: n, n: 2) {{ return x |> dense(m) }}\nout = x |> b |> dense(1)\n{TAIL}"
    ));
    assert_eq!(d.message, "`n` is used before it is defined");
    // Blocks are not values: one may be used above its definition.
    let ok = format!("{HEAD}out = x |> b |> dense(1)\nblock b(x) {{ return x |> relu }}\n{TAIL}");
    assert!(compile_source(&ok, "ok.dm").is_ok());
}
