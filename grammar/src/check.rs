//! The checker: expands blocks and `repeat`, resolves names, infers shapes and produces a
//! [`Model`]. Every error is reported as a [`diag::Error`](crate::diag::Error) with a span.

use crate::ast::*;
use crate::diag::{Error, Kind};
use crate::model::*;
use std::collections::{HashMap, HashSet};

/// Largest number of elements of one per-sample tensor or one parameter.
const MAX_ELEMS: usize = 1 << 40;
/// Largest number of layers after expansion.
const MAX_NODES: usize = 100_000;
/// Largest number of expansion steps (stages applied, blocks entered).
const MAX_STEPS: usize = 1_000_000;
/// Deepest nesting of block uses.
const MAX_BLOCK_DEPTH: usize = 64;
/// Largest dimension of a declared shape.
const MAX_DIM: i64 = 1 << 31;

/// The built-in layer operations (not losses or optimizers).
pub const OPS: &[&str] = &[
    "conv2d",
    "maxpool",
    "avgpool",
    "global_avgpool",
    "dense",
    "flatten",
    "relu",
    "tanh",
    "sigmoid",
    "gelu",
    "add",
    "dropout",
];
const LOSSES: &[&str] = &["mse", "cross_entropy"];
const OPTIMIZERS: &[&str] = &["sgd", "adam", "adamw"];
/// Bare names that are option values (`padding: same`, `activation: relu`, `bias: false`).
const OPTION_WORDS: &[&str] = &[
    "true", "false", "same", "valid", "none", "relu", "tanh", "sigmoid", "gelu",
];

/// A checked value during expansion.
#[derive(Debug, Clone, PartialEq)]
enum Val {
    Tensor(ValueRef),
    Int(i64),
    Float(f64),
    /// An unbound bare name: an option (`same`, `relu`, `true`) or an unknown name.
    Sym(String),
    Tuple(Vec<(Val, Span)>),
}

fn describe(v: &Val) -> String {
    match v {
        Val::Tensor(_) => "a tensor value".into(),
        Val::Int(i) => format!("the integer {i}"),
        Val::Float(f) => format!("the number {f:?}"),
        Val::Sym(s) => format!("`{s}`"),
        Val::Tuple(_) => "a tuple".into(),
    }
}

#[derive(Debug, Clone)]
struct Binding {
    val: Val,
    span: Span,
    used: bool,
    /// Inputs and targets are reported differently when unused.
    what: &'static str,
}

#[derive(Default)]
struct Scope {
    vars: HashMap<String, Binding>,
    order: Vec<String>,
    /// Where every name of this scope is (first) defined: a use of a name before its definition
    /// is an error.
    later: HashMap<String, Span>,
    /// Only definitions starting before this offset are visible (the `loss`, checked after the
    /// whole program, sees only what is defined above it).
    horizon: Option<usize>,
    in_block: Option<String>,
}

impl Scope {
    fn define(&mut self, name: &Ident, val: Val, what: &'static str) -> Result<(), Error> {
        if let Some(prev) = self.vars.get(&name.name) {
            return Err(Error::new(
                Kind::Name,
                name.span,
                format!("`{}` is already defined", name.name),
            )
            .label("defined again here")
            .note(prev.span, "first defined here")
            .help("every value has one definition; choose a new name (e.g. `h2`)"));
        }
        self.vars.insert(
            name.name.clone(),
            Binding {
                val,
                span: name.span,
                used: false,
                what,
            },
        );
        self.order.push(name.name.clone());
        Ok(())
    }
}

struct Frame {
    /// Prefix of user-given layer names in this block instance, e.g. `res_1.` (empty at top level).
    prefix: String,
    /// 1-based iteration numbers of the enclosing `repeat`s within this frame.
    repeat: Vec<usize>,
}

struct Checker<'a> {
    inputs: Vec<TensorDecl>,
    targets: Vec<TensorDecl>,
    nodes: Vec<Node>,
    counters: HashMap<String, usize>,
    node_names: HashMap<String, Span>,
    blocks: HashMap<String, &'a BlockDef>,
    frames: Vec<Frame>,
    steps: usize,
    eof: Span,
}

fn err(kind: Kind, span: Span, msg: impl Into<String>) -> Error {
    Error::new(kind, span, msg)
}

/// Checks a parsed program and builds the [`Model`].
pub fn check(prog: &Program, src: &str) -> Result<Model, Error> {
    let mut c = Checker {
        inputs: vec![],
        targets: vec![],
        nodes: vec![],
        counters: HashMap::new(),
        node_names: HashMap::new(),
        blocks: HashMap::new(),
        frames: vec![Frame {
            prefix: String::new(),
            repeat: vec![],
        }],
        steps: 0,
        eof: last_char(src),
    };
    c.collect_blocks(prog)?;
    let mut scope = Scope::default();
    // Where values are defined: a use before the definition is an error.
    let mut loss: Option<&LossStmt> = None;
    let mut train: Option<&TrainSection> = None;
    for item in &prog.items {
        let name = match item {
            Item::Let(l) => &l.name,
            Item::Input(d) | Item::Target(d) => &d.name,
            _ => continue,
        };
        scope.later.entry(name.name.clone()).or_insert(name.span);
    }
    for item in &prog.items {
        match item {
            Item::Input(d) | Item::Target(d) => {
                let is_input = matches!(item, Item::Input(_));
                let decl = c.decl(d, is_input)?;
                let v = if is_input {
                    c.inputs.push(decl);
                    Val::Tensor(ValueRef::Input(c.inputs.len() - 1))
                } else {
                    c.targets.push(decl);
                    Val::Tensor(ValueRef::Target(c.targets.len() - 1))
                };
                c.no_block_clash(&d.name)?;
                scope.define(&d.name, v, if is_input { "input" } else { "target" })?;
            }
            Item::Let(l) => {
                c.no_block_clash(&l.name)?;
                let v = c.eval(&l.value, &mut scope)?;
                let v = c.storable(v, &l.value, &scope)?;
                scope.define(&l.name, v, "value")?;
            }
            Item::Block(_) => {}
            Item::Loss(l) => {
                if let Some(prev) = loss {
                    return Err(err(
                        Kind::Training,
                        l.span,
                        "the program has more than one `loss`",
                    )
                    .label("second loss")
                    .note(prev.span, "first loss here")
                    .help("a model is trained on one loss; remove one of them"));
                }
                loss = Some(l);
            }
            Item::Train(t) => {
                if let Some(prev) = train {
                    return Err(err(
                        Kind::Training,
                        t.span,
                        "the program has more than one `train` section",
                    )
                    .label("second section")
                    .note(prev.span, "first section here")
                    .help("merge the settings into one `train { ... }`"));
                }
                train = Some(t);
            }
        }
    }
    if c.inputs.is_empty() {
        return Err(
            err(Kind::Name, Span::new(0, 0), "the program declares no input")
                .label("expected `input name: [dims]`")
                .help("declare the network's input first, e.g. `input x: [28, 28, 1]`"),
        );
    }
    let Some(loss_stmt) = loss else {
        return Err(err(Kind::Training, c.eof, "the program has no `loss`")
            .label("expected a `loss` statement after this")
            .help("add e.g. `loss mse(out, y)` or `loss cross_entropy(logits, label)`"));
    };
    // The loss is checked last (its layers are numbered after the program's), but sees only the
    // values defined above it.
    scope.horizon = Some(loss_stmt.span.start);
    let loss = c.loss(loss_stmt, &mut scope)?;
    scope.horizon = None;
    let Some(train) = train else {
        return Err(err(
            Kind::Training,
            c.eof,
            "the program has no `train { ... }` section",
        )
        .label("expected a `train` section after this")
        .help("add e.g. `train { batch: 32, optimizer: sgd(lr: 0.01) }`"));
    };
    let train = c.train(train)?;
    c.check_unused(&scope, "")?;
    c.check_dead(loss.pred)?;
    if c.nodes.iter().all(|n| n.params.is_empty()) {
        return Err(err(
            Kind::Training,
            loss.span,
            "the model has no trainable parameters",
        )
        .label("nothing to train for this loss")
        .help("add a layer with weights, e.g. `dense(...)` or `conv2d(...)`"));
    }
    Ok(Model {
        inputs: c.inputs,
        targets: c.targets,
        nodes: c.nodes,
        output: loss.pred,
        loss,
        train,
    })
}

/// Edit distance for "did you mean" suggestions.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let v = (prev[j] + usize::from(ca != *cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
            cur.push(v);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// Keras / PyTorch spellings of the built-in names (compared in lower case, without `_`).
const ALIASES: &[(&str, &str)] = &[
    ("convolution2d", "conv2d"),
    ("maxpooling2d", "maxpool"),
    ("maxpool2d", "maxpool"),
    ("averagepooling2d", "avgpool"),
    ("avgpool2d", "avgpool"),
    ("globalaveragepooling2d", "global_avgpool"),
    ("adaptiveavgpool2d", "global_avgpool"),
    ("linear", "dense"),
    ("fullyconnected", "dense"),
    ("fc", "dense"),
    ("reshape", "flatten"),
    ("meansquarederror", "mse"),
    ("mseloss", "mse"),
    ("crossentropyloss", "cross_entropy"),
    ("sparsecategoricalcrossentropy", "cross_entropy"),
    ("categoricalcrossentropy", "cross_entropy"),
    ("crossentropy", "cross_entropy"),
    ("nllloss", "cross_entropy"),
];

fn suggest<'x>(name: &str, cands: impl IntoIterator<Item = &'x str>) -> Option<String> {
    let cands: Vec<&str> = cands.into_iter().collect();
    let key: String = name.to_lowercase().chars().filter(|c| *c != '_').collect();
    if let Some((_, target)) = ALIASES.iter().find(|(a, _)| *a == key) {
        if cands.contains(target) {
            return Some(target.to_string());
        }
    }
    if let Some(c) = cands.iter().find(|c| c.replace('_', "") == key) {
        return Some(c.to_string());
    }
    let best = cands
        .into_iter()
        .map(|c| (distance(name, c), c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 3) && *d < c.len())
        .min();
    best.map(|(_, c)| c.to_string())
}

fn op_type_name(layer: &Layer) -> &'static str {
    match layer {
        Layer::Conv2d { .. } => "conv2d",
        Layer::MaxPool { .. } => "maxpool",
        Layer::AvgPool { .. } => "avgpool",
        Layer::GlobalAvgPool => "global_avgpool",
        Layer::Dense { .. } => "dense",
        Layer::Flatten => "flatten",
        Layer::Act(Activation::Relu) => "relu",
        Layer::Act(Activation::Tanh) => "tanh",
        Layer::Act(Activation::Sigmoid) => "sigmoid",
        Layer::Act(Activation::Gelu) => "gelu",
        Layer::Add => "add",
        Layer::Dropout { .. } => "dropout",
    }
}

fn fmt_shape(s: &[usize]) -> String {
    format!(
        "[{}]",
        s.iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// A parameter before it is named: (suffix, shape, fan_in, fan_out, is_bias).
type ParamDraft = (String, Shape, usize, usize, bool);

/// Parameters of a layer signature: (name, has default).
struct Sig {
    op: &'static str,
    params: &'static [(&'static str, bool)],
}

fn sig(op: &str) -> Option<Sig> {
    let params: &'static [(&'static str, bool)] = match op {
        "conv2d" => &[
            ("filters", false),
            ("kernel", false),
            ("stride", true),
            ("padding", true),
            ("bias", true),
            ("activation", true),
        ],
        "maxpool" | "avgpool" => &[("size", false), ("stride", true)],
        "dense" => &[("units", false), ("bias", true), ("activation", true)],
        "dropout" => &[("p", false)],
        "global_avgpool" | "flatten" | "relu" | "tanh" | "sigmoid" | "gelu" => &[],
        _ => return None,
    };
    let op = OPS.iter().copied().find(|o| *o == op)?;
    Some(Sig { op, params })
}

/// Arguments of a call after binding to a signature.
struct Bound {
    vals: HashMap<&'static str, (Val, Span)>,
    call: Span,
}

impl Bound {
    fn get(&self, k: &str) -> Option<&(Val, Span)> {
        self.vals.get(k)
    }
    fn int(&self, k: &str, default: i64, min: i64) -> Result<i64, Error> {
        let Some((v, span)) = self.get(k) else {
            return Ok(default);
        };
        let i = match v {
            Val::Int(i) => *i,
            Val::Float(f) if f.fract() == 0.0 && f.abs() < 1e15 => *f as i64,
            other => {
                let mut e = err(
                    Kind::Argument,
                    *span,
                    format!("`{k}` must be a whole number, found {}", describe(other)),
                )
                .label("expected an integer");
                if matches!(other, Val::Tuple(_)) && matches!(k, "kernel" | "size" | "stride") {
                    e = e.help(format!("kernels, windows and strides are square: write one number, e.g. `{k}: 3` for 3x3"));
                }
                return Err(e);
            }
        };
        if i < min {
            let what = if min == 1 {
                "positive (at least 1)"
            } else {
                "at least 0"
            };
            return Err(err(
                Kind::Argument,
                *span,
                format!("`{k}` must be {what}, found {i}"),
            )
            .label("out of range"));
        }
        if i > MAX_DIM {
            return Err(
                err(Kind::Argument, *span, format!("`{k}` = {i} is too large")).label("too large"),
            );
        }
        Ok(i)
    }
    fn float(&self, k: &str, default: f64) -> Result<f64, Error> {
        let Some((v, span)) = self.get(k) else {
            return Ok(default);
        };
        match v {
            Val::Int(i) => Ok(*i as f64),
            Val::Float(f) => Ok(*f),
            other => Err(err(
                Kind::Argument,
                *span,
                format!("`{k}` must be a number, found {}", describe(other)),
            )
            .label("expected a number")),
        }
    }
    fn boolean(&self, k: &str, default: bool) -> Result<bool, Error> {
        let Some((v, span)) = self.get(k) else {
            return Ok(default);
        };
        match v {
            Val::Sym(s) if s == "true" => Ok(true),
            Val::Sym(s) if s == "false" => Ok(false),
            other => Err(err(
                Kind::Argument,
                *span,
                format!("`{k}` must be `true` or `false`, found {}", describe(other)),
            )
            .label("expected `true` or `false`")),
        }
    }
    fn choice(
        &self,
        k: &str,
        options: &[&'static str],
        default: &'static str,
    ) -> Result<&'static str, Error> {
        let Some((v, span)) = self.get(k) else {
            return Ok(default);
        };
        let list = options
            .iter()
            .map(|o| format!("`{o}`"))
            .collect::<Vec<_>>()
            .join(", ");
        match v {
            Val::Sym(s) => {
                if let Some(o) = options.iter().find(|o| *o == s) {
                    return Ok(o);
                }
                let mut e = err(Kind::Argument, *span, format!("unknown {k} `{s}`"))
                    .label(format!("expected one of {list}"));
                if let Some(sg) = suggest(s, options.iter().copied()) {
                    e = e.help(format!("did you mean `{sg}`?"));
                }
                Err(e)
            }
            other => Err(err(
                Kind::Argument,
                *span,
                format!("`{k}` must be one of {list}, found {}", describe(other)),
            )
            .label("expected a name")),
        }
    }
}

impl<'a> Checker<'a> {
    fn step(&mut self, span: Span) -> Result<(), Error> {
        self.steps += 1;
        if self.steps > MAX_STEPS || self.nodes.len() > MAX_NODES {
            return Err(err(
                Kind::Argument,
                span,
                format!("the expanded network is too large (more than {MAX_NODES} layers)"),
            )
            .label("expanding this exceeds the limit")
            .help("reduce the `repeat` counts or the block nesting"));
        }
        Ok(())
    }

    fn collect_blocks(&mut self, prog: &'a Program) -> Result<(), Error> {
        for item in &prog.items {
            let Item::Block(b) = item else { continue };
            if OPS.contains(&b.name.name.as_str())
                || LOSSES.contains(&b.name.name.as_str())
                || OPTIMIZERS.contains(&b.name.name.as_str())
            {
                return Err(err(
                    Kind::Name,
                    b.name.span,
                    format!("`{}` is a built-in name", b.name.name),
                )
                .label("cannot be redefined")
                .help("choose another name for the block"));
            }
            if let Some(prev) = self.blocks.get(&b.name.name) {
                return Err(err(
                    Kind::Name,
                    b.name.span,
                    format!("block `{}` is defined twice", b.name.name),
                )
                .label("second definition")
                .note(prev.name.span, "first definition"));
            }
            let mut seen: HashMap<&str, Span> = HashMap::new();
            for p in &b.params {
                if let Some(prev) = seen.insert(&p.name.name, p.name.span) {
                    return Err(err(
                        Kind::Name,
                        p.name.span,
                        format!("parameter `{}` appears twice", p.name.name),
                    )
                    .label("duplicate parameter")
                    .note(prev, "first here"));
                }
            }
            self.blocks.insert(b.name.name.clone(), b);
        }
        // Recursion: depth-first search over the call graph.
        let mut names: Vec<&String> = self.blocks.keys().collect();
        names.sort();
        let mut done: HashSet<String> = HashSet::new();
        for n in names {
            let mut stack = vec![];
            self.find_cycle(n, &mut stack, &mut done)?;
        }
        Ok(())
    }

    fn find_cycle(
        &self,
        name: &str,
        stack: &mut Vec<(String, Span)>,
        done: &mut HashSet<String>,
    ) -> Result<(), Error> {
        if done.contains(name) {
            return Ok(());
        }
        if stack.len() > MAX_BLOCK_DEPTH {
            let span = stack.last().map_or(Span::default(), |s| s.1);
            return Err(err(
                Kind::Name,
                span,
                format!("blocks are nested too deeply (more than {MAX_BLOCK_DEPTH} levels)"),
            )
            .label("too deep")
            .help("flatten the block structure"));
        }
        let Some(b) = self.blocks.get(name) else {
            return Ok(());
        };
        let mut calls = vec![];
        for l in &b.body {
            calls_in(&l.value, &mut calls);
        }
        calls_in(&b.ret, &mut calls);
        for p in &b.params {
            if let Some(d) = &p.default {
                calls_in(d, &mut calls);
            }
        }
        for (callee, span) in calls {
            if !self.blocks.contains_key(&callee) {
                continue;
            }
            let on_stack = stack.iter().position(|(n, _)| *n == callee);
            if callee == name || on_stack.is_some() {
                let mut path: Vec<String> = match on_stack {
                    Some(i) => stack[i..].iter().map(|(n, _)| n.clone()).collect(),
                    None => vec![],
                };
                path.push(name.to_string());
                path.push(callee.clone());
                path.dedup();
                let msg = if callee == name {
                    format!("block `{name}` calls itself")
                } else {
                    format!("blocks call each other recursively: {}", path.join(" -> "))
                };
                return Err(err(Kind::Name, span, msg)
                    .label("recursive call")
                    .help("blocks are expanded inline, so they cannot be recursive; use `repeat N { ... }` for runs of layers"));
            }
            stack.push((name.to_string(), span));
            self.find_cycle(&callee, stack, done)?;
            stack.pop();
        }
        done.insert(name.to_string());
        Ok(())
    }

    fn no_block_clash(&self, name: &Ident) -> Result<(), Error> {
        if let Some(b) = self.blocks.get(&name.name) {
            return Err(err(
                Kind::Name,
                name.span,
                format!("`{}` is already the name of a block", name.name),
            )
            .label("value named like a block")
            .note(b.name.span, "block defined here")
            .help("values and blocks share one namespace; rename one of them"));
        }
        if OPS.contains(&name.name.as_str()) || LOSSES.contains(&name.name.as_str()) {
            return Err(err(
                Kind::Name,
                name.span,
                format!("`{}` is a built-in operation", name.name),
            )
            .label("cannot be used as a value name")
            .help("choose another name"));
        }
        Ok(())
    }

    fn decl(&mut self, d: &Decl, is_input: bool) -> Result<TensorDecl, Error> {
        let mut shape = vec![];
        for (v, span) in &d.ty.dims {
            if *v <= 0 {
                return Err(err(Kind::Shape, *span, format!("dimension {v} of `{}` is not positive", d.name.name))
                    .label("must be at least 1")
                    .help("shapes are per sample and do not include the batch size (set it in `train { batch: ... }`)"));
            }
            if *v > MAX_DIM {
                return Err(
                    err(Kind::Shape, *span, format!("dimension {v} is too large"))
                        .label("too large"),
                );
            }
            shape.push(*v as usize);
        }
        self.elems(&shape, d.ty.span)?;
        let dtype = if d.ty.int { DType::I32 } else { DType::F32 };
        if is_input && dtype == DType::I32 {
            return Err(err(Kind::Shape, d.ty.span, "inputs must be float tensors")
                .label("`int` is only for class-label targets")
                .help("write e.g. `input x: [784]`"));
        }
        if dtype == DType::F32 && shape.is_empty() {
            return Err(err(
                Kind::Shape,
                d.ty.span,
                format!("`{}` needs at least one dimension", d.name.name),
            )
            .label("empty shape")
            .help("a single number per sample is `[1]`"));
        }
        Ok(TensorDecl {
            name: d.name.name.clone(),
            shape,
            dtype,
            span: d.span,
        })
    }

    fn elems(&self, shape: &[usize], span: Span) -> Result<usize, Error> {
        let mut n: usize = 1;
        for d in shape {
            n = n
                .checked_mul(*d)
                .filter(|n| *n <= MAX_ELEMS)
                .ok_or_else(|| {
                    err(
                        Kind::Shape,
                        span,
                        format!("tensor of shape {} is too large", fmt_shape(shape)),
                    )
                    .label("more than 2^40 elements")
                })?;
        }
        Ok(n)
    }

    fn shape_of(&self, v: ValueRef) -> &Shape {
        match v {
            ValueRef::Input(i) => &self.inputs[i].shape,
            ValueRef::Target(i) => &self.targets[i].shape,
            ValueRef::Node(i) => &self.nodes[i].shape,
        }
    }

    /// What may be bound to a name: tensors and numbers.
    fn storable(&self, v: Val, e: &Expr, scope: &Scope) -> Result<Val, Error> {
        match v {
            Val::Sym(s) => Err(self.unknown_name(&s, e.span, Some(scope))),
            Val::Tuple(_) => Err(
                err(Kind::Argument, e.span, "a tuple cannot be given a name")
                    .label("tuples are only used as arguments (e.g. `betas: (0.9, 0.999)`)"),
            ),
            v => Ok(v),
        }
    }

    fn unknown_name(&self, name: &str, span: Span, scope: Option<&Scope>) -> Error {
        let mut e = err(Kind::Name, span, format!("unknown name `{name}`")).label("not defined");
        if OPS.contains(&name) || self.blocks.contains_key(name) {
            return e.label("an operation, not a value").help(format!(
                "`{name}` is an operation; apply it to a value: `x |> {name}` or `{name}(x)`"
            ));
        }
        if let Some(s) = scope {
            if let Some(later) = s.later.get(name) {
                if later.start > span.start {
                    return self.before_definition(name, span, *later);
                }
            }
            if let Some(b) = &s.in_block {
                e = e.help(format!("a block only sees its parameters and its own values; pass `{name}` to block `{b}` as a parameter"));
            }
            if e.help.is_none() {
                if let Some(sg) = suggest(name, s.vars.keys().map(|k| k.as_str())) {
                    e = e.help(format!("did you mean `{sg}`?"));
                }
            }
        }
        e
    }

    /// A use of `name` at `used` before its definition at `def`.
    fn before_definition(&self, name: &str, used: Span, def: Span) -> Error {
        err(
            Kind::Name,
            used,
            format!("`{name}` is used before it is defined"),
        )
        .label("used here")
        .note(def, format!("`{name}` is defined here, below its use"))
        .help(format!(
            "move the definition of `{name}` above its first use: values are defined before they are used"
        ))
    }

    fn expect_tensor(
        &self,
        v: &Val,
        span: Span,
        what: &str,
        scope: &Scope,
    ) -> Result<ValueRef, Error> {
        match v {
            Val::Tensor(r) => {
                if let ValueRef::Target(i) = r {
                    return Err(err(
                        Kind::Name,
                        span,
                        format!(
                            "target `{}` cannot be fed to a layer",
                            self.targets[*i].name
                        ),
                    )
                    .label("a target")
                    .help("targets are only used in the `loss`"));
                }
                Ok(*r)
            }
            Val::Sym(s) => Err(self.unknown_name(s, span, Some(scope))),
            other => Err(err(
                Kind::Argument,
                span,
                format!("{what} must be a tensor value, found {}", describe(other)),
            )
            .label("not a tensor")),
        }
    }

    fn eval(&mut self, e: &Expr, scope: &mut Scope) -> Result<Val, Error> {
        self.step(e.span)?;
        match &e.kind {
            ExprKind::Int(i) => Ok(Val::Int(*i)),
            ExprKind::Float(f) => Ok(Val::Float(*f)),
            ExprKind::Name(n) => {
                let horizon = scope.horizon;
                match scope.vars.get_mut(n) {
                    Some(b) if !matches!(horizon, Some(h) if b.span.start > h) => {
                        b.used = true;
                        return Ok(b.val.clone());
                    }
                    _ => {}
                }
                // A name defined further down (not an option word such as `relu`, which may
                // also name a value).
                if let Some(def) = scope.later.get(n) {
                    if def.start > e.span.start && !OPTION_WORDS.contains(&n.as_str()) {
                        return Err(self.before_definition(n, e.span, *def));
                    }
                }
                Ok(Val::Sym(n.clone()))
            }
            ExprKind::Tuple(items) => {
                let mut out = vec![];
                for it in items {
                    out.push((self.eval(it, scope)?, it.span));
                }
                Ok(Val::Tuple(out))
            }
            ExprKind::Add(terms) => {
                let Some(first) = terms.first() else {
                    return Err(err(Kind::Syntax, e.span, "empty sum").label("nothing to add"));
                };
                let v = self.eval(first, scope)?;
                let mut acc = self.expect_tensor(&v, first.span, "the left side of `+`", scope)?;
                for (i, t) in terms.iter().enumerate().skip(1) {
                    let vb = self.eval(t, scope)?;
                    let rb = self.expect_tensor(&vb, t.span, "the right side of `+`", scope)?;
                    let left = Span::new(first.span.start, terms[i - 1].span.end);
                    let span = Span::new(first.span.start, t.span.end);
                    acc = match self.add(acc, left, rb, t.span, span, None)? {
                        Val::Tensor(r) => r,
                        _ => return Err(err(Kind::Shape, span, "cannot add these values")),
                    };
                }
                Ok(Val::Tensor(acc))
            }
            ExprKind::Pipe(input, stages) => {
                let v = self.eval(input, scope)?;
                let mut r = self.expect_tensor(&v, input.span, "the input of a pipeline", scope)?;
                let mut out = Val::Tensor(r);
                for st in stages {
                    out = self.stage(st, r, scope)?;
                    r = self.expect_tensor(&out, st.span, "a stage's result", scope)?;
                }
                Ok(out)
            }
            ExprKind::Call { func, args, label } => {
                self.call(func, args, label.as_ref(), None, e.span, scope)
            }
            ExprKind::Repeat { .. } => Err(err(
                Kind::Syntax,
                e.span,
                "`repeat` can only be used as a pipeline stage",
            )
            .label("not after `|>`")),
        }
    }

    fn stage(&mut self, st: &Expr, input: ValueRef, scope: &mut Scope) -> Result<Val, Error> {
        self.step(st.span)?;
        match &st.kind {
            ExprKind::Name(n) => {
                if scope.vars.contains_key(n) {
                    return Err(err(
                        Kind::Name,
                        st.span,
                        format!("`{n}` is a value, not an operation"),
                    )
                    .label("cannot be applied with `|>`")
                    .help("stages after `|>` must be operations or blocks, e.g. `|> relu`"));
                }
                let func = Ident {
                    name: n.clone(),
                    span: st.span,
                };
                self.call(&func, &[], None, Some(input), st.span, scope)
            }
            ExprKind::Call { func, args, label } => {
                self.call(func, args, label.as_ref(), Some(input), st.span, scope)
            }
            ExprKind::Repeat { count, body } => {
                let cv = self.eval(count, scope)?;
                let n = match cv {
                    Val::Int(n) if n >= 1 => n as usize,
                    Val::Int(n) => {
                        return Err(err(
                            Kind::Argument,
                            count.span,
                            format!("repeat count must be at least 1, found {n}"),
                        )
                        .label("out of range"))
                    }
                    other => {
                        return Err(err(
                            Kind::Argument,
                            count.span,
                            format!(
                                "repeat count must be a whole number, found {}",
                                describe(&other)
                            ),
                        )
                        .label("expected an integer"))
                    }
                };
                let mut cur = input;
                for i in 1..=n {
                    self.frame().repeat.push(i);
                    for s in body {
                        let v = self.stage(s, cur, scope);
                        let v = match v {
                            Ok(v) => v,
                            Err(e) => {
                                self.frame().repeat.pop();
                                return Err(e);
                            }
                        };
                        cur = self.expect_tensor(&v, s.span, "a stage's result", scope)?;
                    }
                    self.frame().repeat.pop();
                }
                Ok(Val::Tensor(cur))
            }
            _ => Err(
                err(Kind::Syntax, st.span, "expected an operation after `|>`")
                    .label("not an operation"),
            ),
        }
    }

    fn frame(&mut self) -> &mut Frame {
        if self.frames.is_empty() {
            self.frames.push(Frame {
                prefix: String::new(),
                repeat: vec![],
            });
        }
        let n = self.frames.len() - 1;
        &mut self.frames[n]
    }

    /// Full name of a user-named layer or block instance.
    fn qualify(&mut self, label: &str) -> String {
        let f = self.frame();
        let mut s = format!("{}{}", f.prefix, label);
        for i in &f.repeat {
            s.push_str(&format!("_{i}"));
        }
        s
    }

    fn auto_name(&mut self, kind: &str) -> String {
        let c = self.counters.entry(kind.to_string()).or_insert(0);
        *c += 1;
        format!("{kind}_{c}")
    }

    #[allow(clippy::too_many_arguments)]
    fn push_node(
        &mut self,
        name: String,
        name_span: Span,
        layer: Layer,
        inputs: Vec<ValueRef>,
        shape: Shape,
        params: Vec<ParamSpec>,
        span: Span,
    ) -> Result<ValueRef, Error> {
        self.elems(&shape, span)?;
        if let Some(prev) = self.node_names.get(&name) {
            return Err(err(Kind::Name, name_span, format!("duplicate layer name `{name}`"))
                .label("this layer's name is already taken")
                .note(*prev, "first layer with that name")
                .help("layer names become parameter names in weight files and must be unique; rename one (`as other_name`)"));
        }
        self.node_names.insert(name.clone(), name_span);
        self.nodes.push(Node {
            name,
            layer,
            inputs,
            shape,
            params,
            span,
        });
        if self.nodes.len() > MAX_NODES {
            return Err(err(
                Kind::Argument,
                span,
                format!("the expanded network is too large (more than {MAX_NODES} layers)"),
            )
            .label("expanding this exceeds the limit"));
        }
        Ok(ValueRef::Node(self.nodes.len() - 1))
    }

    fn layer_name(&mut self, kind: &str, label: Option<&Ident>) -> (String, Option<Span>) {
        match label {
            Some(l) => (self.qualify(&l.name), Some(l.span)),
            None => (self.auto_name(kind), None),
        }
    }

    fn add(
        &mut self,
        a: ValueRef,
        sa: Span,
        b: ValueRef,
        sb: Span,
        span: Span,
        label: Option<&Ident>,
    ) -> Result<Val, Error> {
        let (ta, tb) = (self.shape_of(a).clone(), self.shape_of(b).clone());
        if ta != tb {
            let _ = span;
            return Err(err(Kind::Shape, sb, format!("cannot add values of shapes {} and {}", fmt_shape(&ta), fmt_shape(&tb)))
                .label(format!("this is {}", fmt_shape(&tb)))
                .note(sa, format!("this is {}", fmt_shape(&ta)))
                .help("`+` adds elementwise and needs equal shapes; for a residual connection, give the branch as many channels as its input (e.g. with a 1x1 `conv2d`)"));
        }
        let (name, ns) = self.layer_name("add", label);
        let r = self.push_node(
            name,
            ns.unwrap_or(span),
            Layer::Add,
            vec![a, b],
            ta,
            vec![],
            span,
        )?;
        Ok(Val::Tensor(r))
    }

    fn call(
        &mut self,
        func: &Ident,
        args: &[Arg],
        label: Option<&Ident>,
        piped: Option<ValueRef>,
        span: Span,
        scope: &mut Scope,
    ) -> Result<Val, Error> {
        let name = func.name.as_str();
        if let Some(b) = self.blocks.get(name).copied() {
            return self.expand_block(b, func, args, label, piped, span, scope);
        }
        if scope.vars.contains_key(name) {
            return Err(err(
                Kind::Name,
                func.span,
                format!("`{name}` is a value, not an operation"),
            )
            .label("cannot be called"));
        }
        if LOSSES.contains(&name) {
            return Err(err(
                Kind::Name,
                func.span,
                format!("`{name}` is a loss, not a layer"),
            )
            .label("used as a layer")
            .help(format!(
                "losses go in a `loss` statement: `loss {name}(prediction, target)`"
            )));
        }
        if OPTIMIZERS.contains(&name) {
            return Err(err(
                Kind::Name,
                func.span,
                format!("`{name}` is an optimizer, not a layer"),
            )
            .label("used as a layer")
            .help(format!(
                "optimizers go in the train section: `train {{ optimizer: {name}(...) }}`"
            )));
        }
        if name == "add" {
            return self.add_call(func, args, label, piped, span, scope);
        }
        let Some(sig) = sig(name) else {
            let mut e = err(Kind::Name, func.span, format!("unknown operation `{name}`"))
                .label("not an operation or block");
            let cands: Vec<&str> = OPS
                .iter()
                .copied()
                .chain(self.blocks.keys().map(|s| s.as_str()))
                .collect();
            e = match suggest(name, cands.iter().copied()) {
                Some(s) => e.help(format!("did you mean `{s}`?")),
                None => e.help(format!("the operations are: {}", OPS.join(", "))),
            };
            return Err(e);
        };
        // Input value.
        let mut positional: Vec<(Val, Span)> = vec![];
        let mut kw: Vec<(&Ident, Val, Span)> = vec![];
        for a in args {
            let v = self.eval(&a.value, scope)?;
            match &a.name {
                Some(n) => kw.push((n, v, a.value.span)),
                None => {
                    if !kw.is_empty() {
                        return Err(err(
                            Kind::Argument,
                            a.span,
                            "positional argument after a keyword argument",
                        )
                        .label("positional")
                        .help("put positional arguments first"));
                    }
                    positional.push((v, a.value.span));
                }
            }
        }
        let input = match piped {
            Some(r) => {
                if let Some((Val::Tensor(_), s)) = positional.first() {
                    return Err(err(
                        Kind::Argument,
                        *s,
                        format!("`{name}` gets its input from `|>` and cannot take another"),
                    )
                    .label("second input")
                    .help(format!(
                        "remove this argument, or write `{name}(...)` without the pipe"
                    )));
                }
                r
            }
            None => match positional.first() {
                Some((Val::Tensor(_), _)) | Some((Val::Sym(_), _)) => {
                    let (v, s) = positional.remove(0);
                    self.expect_tensor(&v, s, &format!("the input of `{name}`"), scope)?
                }
                _ => {
                    let shown = if args.is_empty() {
                        String::new()
                    } else {
                        "...".to_string()
                    };
                    return Err(err(Kind::Argument, span, format!("`{name}` has no input value"))
                        .label("input missing")
                        .help(format!("pipe a value into it (`x |> {name}({shown})`) or pass it first (`{name}(x{})`)", if shown.is_empty() { "" } else { ", ..." })));
                }
            },
        };
        let bound = self.bind(&sig, positional, kw, func, span)?;
        self.apply_op(sig.op, &bound, input, label, span)
    }

    fn bind(
        &self,
        sig: &Sig,
        positional: Vec<(Val, Span)>,
        kw: Vec<(&Ident, Val, Span)>,
        func: &Ident,
        span: Span,
    ) -> Result<Bound, Error> {
        let op = sig.op;
        let mut vals: HashMap<&'static str, (Val, Span)> = HashMap::new();
        let nparams = sig.params.len();
        for (i, (v, s)) in positional.into_iter().enumerate() {
            if i >= nparams {
                let list: Vec<String> = sig.params.iter().map(|(n, _)| n.to_string()).collect();
                let msg = if nparams == 0 {
                    format!("`{op}` takes no arguments besides its input")
                } else {
                    format!("too many arguments for `{op}`: it takes at most {nparams} after its input ({})", list.join(", "))
                };
                let mut e = err(Kind::Argument, s, msg).label("unexpected argument");
                if let Val::Tensor(_) = v {
                    e = e.help(format!(
                        "`{op}` takes one input value; to combine two values use `a + b`"
                    ));
                }
                return Err(e);
            }
            vals.insert(sig.params[i].0, (v, s));
        }
        for (n, v, s) in kw {
            let Some((pname, _)) = sig.params.iter().find(|(p, _)| *p == n.name) else {
                let mut e = err(
                    Kind::Argument,
                    n.span,
                    format!("`{op}` has no argument `{}`", n.name),
                )
                .label("unknown argument");
                let list: Vec<&str> = sig.params.iter().map(|(p, _)| *p).collect();
                e = match suggest(&n.name, list.iter().copied()) {
                    Some(sg) => e.help(format!("did you mean `{sg}`?")),
                    None if list.is_empty() => e.help(format!("`{op}` takes no arguments")),
                    None => e.help(format!("`{op}` accepts: {}", list.join(", "))),
                };
                return Err(e);
            };
            if let Some((_, prev)) = vals.get(pname) {
                return Err(err(
                    Kind::Argument,
                    n.span,
                    format!("argument `{pname}` is given twice"),
                )
                .label("given again here")
                .note(*prev, "first given here"));
            }
            vals.insert(pname, (v, s));
        }
        for (p, has_default) in sig.params {
            if !has_default && !vals.contains_key(p) {
                let req: Vec<&str> = sig
                    .params
                    .iter()
                    .filter(|(_, d)| !d)
                    .map(|(n, _)| *n)
                    .collect();
                return Err(err(
                    Kind::Argument,
                    span,
                    format!("`{op}` is missing its `{p}` argument"),
                )
                .label(format!("`{p}` not given"))
                .note(func.span, format!("`{op}` needs: {}", req.join(", ")))
                .help(example(op)));
            }
        }
        Ok(Bound { vals, call: span })
    }

    fn conv_like_input(
        &self,
        op: &str,
        input: ValueRef,
        span: Span,
    ) -> Result<(usize, usize, usize), Error> {
        let s = self.shape_of(input).clone();
        if s.len() != 3 {
            let mut e = err(
                Kind::Shape,
                span,
                format!(
                    "`{op}` expects an image [height, width, channels], got {}",
                    fmt_shape(&s)
                ),
            )
            .label(format!("input is {}", fmt_shape(&s)));
            if s.len() == 2 {
                e = e.help("declare images with a channel dimension, e.g. `input x: [28, 28, 1]`");
            } else if s.len() == 1 {
                e = e.help(format!(
                    "`{op}` works on images; the input has already been flattened"
                ));
            }
            return Err(e);
        }
        Ok((s[0], s[1], s[2]))
    }

    fn apply_op(
        &mut self,
        op: &'static str,
        b: &Bound,
        input: ValueRef,
        label: Option<&Ident>,
        span: Span,
    ) -> Result<Val, Error> {
        let ispan = b.call;
        let in_shape = self.shape_of(input).clone();
        let (layer, shape, params, act): (Layer, Shape, Vec<ParamDraft>, Option<Activation>) =
            match op {
                "conv2d" => {
                    let filters = b.int("filters", 0, 1)? as usize;
                    let kernel = b.int("kernel", 0, 1)? as usize;
                    let stride = b.int("stride", 1, 1)? as usize;
                    let padding = match b.choice("padding", &["same", "valid"], "same")? {
                        "valid" => Padding::Valid,
                        _ => Padding::Same,
                    };
                    let bias = b.boolean("bias", true)?;
                    let act = activation(b)?;
                    let (h, w, c) = self.conv_like_input(op, input, ispan)?;
                    let (oh, ow) = match padding {
                        Padding::Same => (h.div_ceil(stride), w.div_ceil(stride)),
                        Padding::Valid => {
                            if kernel > h || kernel > w {
                                let ks = b.get("kernel").map_or(span, |x| x.1);
                                return Err(err(Kind::Shape, ks, format!("kernel {kernel}x{kernel} is larger than its {h}x{w} input (padding: valid)"))
                                .label("kernel too large")
                                .help("use a smaller kernel, or `padding: same`"));
                            }
                            ((h - kernel) / stride + 1, (w - kernel) / stride + 1)
                        }
                    };
                    // Checked first: the weight's element count bounds every product below.
                    self.elems(&[kernel, kernel, c, filters], span)?;
                    let fan_in = kernel * kernel * c;
                    let fan_out = kernel * kernel * filters;
                    let mut ps = vec![(
                        "weight".to_string(),
                        vec![kernel, kernel, c, filters],
                        fan_in,
                        fan_out,
                        false,
                    )];
                    if bias {
                        ps.push(("bias".to_string(), vec![filters], fan_in, fan_out, true));
                    }
                    (
                        Layer::Conv2d {
                            filters,
                            kernel,
                            stride,
                            padding,
                            bias,
                        },
                        vec![oh, ow, filters],
                        ps,
                        act,
                    )
                }
                "maxpool" | "avgpool" => {
                    let size = b.int("size", 0, 1)? as usize;
                    let stride = b.int("stride", size as i64, 1)? as usize;
                    let (h, w, c) = self.conv_like_input(op, input, ispan)?;
                    if size > h || size > w {
                        let ss = b.get("size").map_or(span, |x| x.1);
                        return Err(err(Kind::Shape, ss, format!("pool window {size}x{size} is larger than its {h}x{w} input"))
                        .label("window too large")
                        .help("pooling uses 'valid' windows; use a smaller size or remove a pooling layer earlier in the network"));
                    }
                    let shape = vec![(h - size) / stride + 1, (w - size) / stride + 1, c];
                    let layer = if op == "maxpool" {
                        Layer::MaxPool { size, stride }
                    } else {
                        Layer::AvgPool { size, stride }
                    };
                    (layer, shape, vec![], None)
                }
                "global_avgpool" => {
                    let (_, _, c) = self.conv_like_input(op, input, ispan)?;
                    (Layer::GlobalAvgPool, vec![c], vec![], None)
                }
                "dense" => {
                    let units = b.int("units", 0, 1)? as usize;
                    let bias = b.boolean("bias", true)?;
                    let act = activation(b)?;
                    if in_shape.len() != 1 {
                        return Err(err(
                            Kind::Shape,
                            ispan,
                            format!(
                                "`dense` expects a flat input [features], got {}",
                                fmt_shape(&in_shape)
                            ),
                        )
                        .label(format!("input is {}", fmt_shape(&in_shape)))
                        .help("add `|> flatten` (or `|> global_avgpool`) before it"));
                    }
                    let fin = in_shape[0];
                    let mut ps = vec![("weight".to_string(), vec![fin, units], fin, units, false)];
                    if bias {
                        ps.push(("bias".to_string(), vec![units], fin, units, true));
                    }
                    (Layer::Dense { units, bias }, vec![units], ps, act)
                }
                "flatten" => {
                    let n = self.elems(&in_shape, span)?;
                    (Layer::Flatten, vec![n], vec![], None)
                }
                "relu" => (Layer::Act(Activation::Relu), in_shape, vec![], None),
                "tanh" => (Layer::Act(Activation::Tanh), in_shape, vec![], None),
                "sigmoid" => (Layer::Act(Activation::Sigmoid), in_shape, vec![], None),
                "gelu" => (Layer::Act(Activation::Gelu), in_shape, vec![], None),
                "dropout" => {
                    let p = b.float("p", 0.0)?;
                    if !(0.0..1.0).contains(&p) {
                        let ps = b.get("p").map_or(span, |x| x.1);
                        return Err(err(
                            Kind::Argument,
                            ps,
                            format!("dropout probability must be in [0, 1), found {p:?}"),
                        )
                        .label("out of range")
                        .help("`p` is the probability of dropping a unit, e.g. `dropout(0.5)`"));
                    }
                    (Layer::Dropout { p: p as f32 }, in_shape, vec![], None)
                }
                _ => {
                    return Err(
                        err(Kind::Name, span, format!("unknown operation `{op}`")).label("unknown")
                    )
                }
            };
        let kind = op_type_name(&layer);
        let (name, ns) = self.layer_name(kind, label);
        let mut specs = vec![];
        for (pn, shape, fan_in, fan_out, is_bias) in params {
            self.elems(&shape, span)?;
            specs.push(ParamSpec {
                name: format!("{name}.{pn}"),
                shape,
                fan_in,
                fan_out,
                is_bias,
            });
        }
        let r = self.push_node(
            name.clone(),
            ns.unwrap_or(span),
            layer,
            vec![input],
            shape.clone(),
            specs,
            span,
        )?;
        if let Some(a) = act {
            let an = format!("{name}_{}", act_name(a));
            let r2 = self.push_node(
                an,
                ns.unwrap_or(span),
                Layer::Act(a),
                vec![r],
                shape,
                vec![],
                span,
            )?;
            return Ok(Val::Tensor(r2));
        }
        Ok(Val::Tensor(r))
    }

    fn add_call(
        &mut self,
        func: &Ident,
        args: &[Arg],
        label: Option<&Ident>,
        piped: Option<ValueRef>,
        span: Span,
        scope: &mut Scope,
    ) -> Result<Val, Error> {
        let mut vals = vec![];
        if let Some(p) = piped {
            vals.push((p, func.span));
        }
        for a in args {
            if let Some(n) = &a.name {
                return Err(err(
                    Kind::Argument,
                    n.span,
                    format!("`add` has no argument `{}`", n.name),
                )
                .label("unknown argument")
                .help("write `add(a, b)` or `a + b`"));
            }
            let v = self.eval(&a.value, scope)?;
            let r = self.expect_tensor(&v, a.value.span, "an argument of `add`", scope)?;
            vals.push((r, a.value.span));
        }
        if vals.len() != 2 {
            return Err(err(
                Kind::Argument,
                span,
                format!("`add` takes exactly 2 values, got {}", vals.len()),
            )
            .label("wrong number of values")
            .help("write `add(a, b)`, `a |> add(b)` or `a + b`"));
        }
        self.add(vals[0].0, vals[0].1, vals[1].0, vals[1].1, span, label)
    }

    #[allow(clippy::too_many_arguments)]
    fn expand_block(
        &mut self,
        b: &'a BlockDef,
        func: &Ident,
        args: &[Arg],
        label: Option<&Ident>,
        piped: Option<ValueRef>,
        span: Span,
        scope: &mut Scope,
    ) -> Result<Val, Error> {
        let bname = &b.name.name;
        if self.frames.len() > MAX_BLOCK_DEPTH {
            return Err(err(
                Kind::Name,
                span,
                format!("blocks are nested too deeply (more than {MAX_BLOCK_DEPTH} levels)"),
            )
            .label("too deep"));
        }
        let mut vals: Vec<Option<(Val, Span)>> = vec![None; b.params.len()];
        let mut next = 0;
        if let Some(p) = piped {
            if b.params.is_empty() {
                return Err(err(
                    Kind::Argument,
                    span,
                    format!("block `{bname}` has no parameter to receive the piped value"),
                )
                .label("piped into here")
                .note(b.name.span, "block defined here")
                .help(format!(
                    "give it an input parameter: `block {bname}(x, ...)`"
                )));
            }
            vals[0] = Some((Val::Tensor(p), func.span));
            next = 1;
        }
        let mut seen_kw = false;
        for a in args {
            let v = self.eval(&a.value, scope)?;
            match &a.name {
                None => {
                    if seen_kw {
                        return Err(err(
                            Kind::Argument,
                            a.span,
                            "positional argument after a keyword argument",
                        )
                        .label("positional")
                        .help("put positional arguments first"));
                    }
                    if next >= b.params.len() {
                        return Err(err(
                            Kind::Argument,
                            a.value.span,
                            format!(
                                "too many arguments for block `{bname}`: it takes {}{}",
                                b.params.len(),
                                if piped.is_some() {
                                    " (including the piped value)"
                                } else {
                                    ""
                                }
                            ),
                        )
                        .label("unexpected argument")
                        .note(b.name.span, "block defined here"));
                    }
                    vals[next] = Some((v, a.value.span));
                    next += 1;
                }
                Some(n) => {
                    seen_kw = true;
                    let Some(i) = b.params.iter().position(|p| p.name.name == n.name) else {
                        let list: Vec<&str> =
                            b.params.iter().map(|p| p.name.name.as_str()).collect();
                        return Err(err(
                            Kind::Argument,
                            n.span,
                            format!("block `{bname}` has no parameter `{}`", n.name),
                        )
                        .label("unknown argument")
                        .note(b.name.span, "block defined here")
                        .help(format!("its parameters are: {}", list.join(", "))));
                    };
                    if let Some((_, prev)) = &vals[i] {
                        return Err(err(
                            Kind::Argument,
                            n.span,
                            format!("parameter `{}` is given twice", n.name),
                        )
                        .label("given again here")
                        .note(*prev, "first given here"));
                    }
                    vals[i] = Some((v, a.value.span));
                }
            }
        }
        // Instance name and frame.
        let inst = match label {
            Some(l) => self.qualify(&l.name),
            None => self.auto_name(bname),
        };
        let mut inner = Scope {
            in_block: Some(bname.clone()),
            ..Scope::default()
        };
        // A parameter's default may use the parameters before it, and the body its own values
        // above each use.
        let names = b.params.iter().map(|p| &p.name);
        for n in names.chain(b.body.iter().map(|l| &l.name)) {
            inner.later.entry(n.name.clone()).or_insert(n.span);
        }
        for (i, p) in b.params.iter().enumerate() {
            let v = match vals[i].take() {
                Some((v, s)) => {
                    if let Val::Sym(name) = &v {
                        if !OPTION_WORDS.contains(&name.as_str()) {
                            return Err(self.unknown_name(name, s, Some(scope)));
                        }
                    }
                    v
                }
                None => match &p.default {
                    Some(d) => self.eval(d, &mut inner)?,
                    None => {
                        return Err(err(
                            Kind::Argument,
                            span,
                            format!("block `{bname}` is missing its `{}` argument", p.name.name),
                        )
                        .label(format!("`{}` not given", p.name.name))
                        .note(p.name.span, "parameter declared here"))
                    }
                },
            };
            inner.define(&p.name, v, "parameter")?;
        }
        self.frames.push(Frame {
            prefix: format!("{inst}."),
            repeat: vec![],
        });
        let res = self.block_body(b, &mut inner);
        self.frames.pop();
        // An error inside the block's body: also show which use of the block it came from
        // (shapes and arguments differ between uses).
        let v = res.map_err(|mut e| {
            let inside = e.span.start >= b.span.start && e.span.end <= b.span.end;
            let uses = e
                .notes
                .iter()
                .filter(|(_, t)| t.starts_with("in this use of block"))
                .count();
            if inside && uses < 4 {
                e = e.note(span, format!("in this use of block `{bname}`"));
            }
            e
        })?;
        if let Some(l) = label {
            // The instance name must be unique too (its layers are prefixed by it).
            if let Some(prev) = self.node_names.get(&inst) {
                return Err(
                    err(Kind::Name, l.span, format!("duplicate layer name `{inst}`"))
                        .label("name already taken")
                        .note(*prev, "first use"),
                );
            }
            self.node_names.insert(inst, l.span);
        }
        Ok(v)
    }

    fn block_body(&mut self, b: &'a BlockDef, inner: &mut Scope) -> Result<Val, Error> {
        for l in &b.body {
            if let Some(p) = b.params.iter().find(|p| p.name.name == l.name.name) {
                return Err(err(
                    Kind::Name,
                    l.name.span,
                    format!(
                        "`{}` is already a parameter of block `{}`",
                        l.name.name, b.name.name
                    ),
                )
                .label("defined again here")
                .note(p.name.span, "parameter declared here")
                .help("choose a new name (e.g. `h`)"));
            }
            self.no_block_clash(&l.name)?;
            let v = self.eval(&l.value, inner)?;
            let v = self.storable(v, &l.value, inner)?;
            inner.define(&l.name, v, "value")?;
        }
        let v = self.eval(&b.ret, inner)?;
        let v = match v {
            Val::Tensor(r) => Val::Tensor(r),
            Val::Sym(s) => return Err(self.unknown_name(&s, b.ret.span, Some(inner))),
            other => {
                return Err(err(
                    Kind::Argument,
                    b.ret.span,
                    format!(
                        "a block must return a tensor value, found {}",
                        describe(&other)
                    ),
                )
                .label("not a tensor"))
            }
        };
        self.check_unused(inner, &format!(" in block `{}`", b.name.name))?;
        Ok(v)
    }

    fn check_unused(&self, scope: &Scope, where_: &str) -> Result<(), Error> {
        for n in &scope.order {
            let b = &scope.vars[n];
            if b.used {
                continue;
            }
            let (msg, help) = match b.what {
                "input" => (
                    format!("input `{n}` is never used"),
                    "feed it to the network, or remove it".to_string(),
                ),
                "target" => (
                    format!("target `{n}` is never used"),
                    "use it in the `loss`, or remove it".to_string(),
                ),
                "parameter" => continue,
                _ => (
                    format!("`{n}` is never used{where_}"),
                    "every value must contribute to the loss; use it or remove it".to_string(),
                ),
            };
            return Err(err(Kind::Name, b.span, msg)
                .label("defined here but never used")
                .help(help));
        }
        Ok(())
    }

    /// Every layer must contribute to the loss' prediction.
    fn check_dead(&self, pred: ValueRef) -> Result<(), Error> {
        let mut live = vec![false; self.nodes.len()];
        if let ValueRef::Node(i) = pred {
            live[i] = true;
        }
        for i in (0..self.nodes.len()).rev() {
            if !live[i] {
                continue;
            }
            for inp in &self.nodes[i].inputs {
                if let ValueRef::Node(j) = inp {
                    live[*j] = true;
                }
            }
        }
        if let Some(i) = live.iter().position(|l| !l) {
            let n = &self.nodes[i];
            return Err(err(
                Kind::Name,
                n.span,
                format!("layer `{}` does not contribute to the loss", n.name),
            )
            .label("its output is never used")
            .help("remove it, or use its result"));
        }
        Ok(())
    }

    fn loss(&mut self, l: &LossStmt, scope: &mut Scope) -> Result<Loss, Error> {
        let kind = match l.func.name.as_str() {
            "mse" => LossKind::Mse,
            "cross_entropy" => LossKind::CrossEntropy,
            other => {
                let mut e = err(
                    Kind::Training,
                    l.func.span,
                    format!("unknown loss `{other}`"),
                )
                .label("not a loss");
                e = match suggest(other, LOSSES.iter().copied()) {
                    Some(s) => e.help(format!("did you mean `{s}`? the losses are `mse` and `cross_entropy`")),
                    None => e.help("the losses are `mse(prediction, target)` and `cross_entropy(logits, labels)`"),
                };
                return Err(e);
            }
        };
        let fname = &l.func.name;
        if let Some(a) = l.args.iter().find(|a| a.name.is_some()) {
            let n = a.name.as_ref().map(|n| n.name.clone()).unwrap_or_default();
            return Err(err(
                Kind::Argument,
                a.span,
                format!("`{fname}` has no argument `{n}`"),
            )
            .label("unknown argument")
            .help(format!("write `loss {fname}(prediction, target)`")));
        }
        if l.args.len() != 2 {
            return Err(err(
                Kind::Argument,
                l.span,
                format!(
                    "`{fname}` takes 2 arguments (prediction, target), got {}",
                    l.args.len()
                ),
            )
            .label("wrong number of arguments")
            .help(format!("write `loss {fname}(prediction, target)`")));
        }
        let pv = self.eval(&l.args[0].value, scope)?;
        let pspan = l.args[0].value.span;
        let pred = match pv {
            Val::Tensor(ValueRef::Target(_)) => {
                return Err(err(
                    Kind::Training,
                    pspan,
                    "the prediction of the loss is a target",
                )
                .label("this is a target")
                .help(format!(
                    "write `loss {fname}(prediction, target)` with the prediction first"
                )))
            }
            v => self.expect_tensor(&v, pspan, "the prediction", scope)?,
        };
        if !matches!(pred, ValueRef::Node(_)) {
            return Err(err(
                Kind::Training,
                pspan,
                "the loss' prediction must be computed by layers",
            )
            .label("this is an input")
            .help("apply at least one layer, e.g. `out = x |> dense(1)`"));
        }
        let tspan = l.args[1].value.span;
        let tv = self.eval(&l.args[1].value, scope)?;
        let target = match tv {
            Val::Tensor(r @ ValueRef::Target(_)) => r,
            Val::Sym(s) => return Err(self.unknown_name(&s, tspan, Some(scope))),
            _ => {
                return Err(err(
                    Kind::Training,
                    tspan,
                    format!("the second argument of `{fname}` must be a declared `target`"),
                )
                .label("not a target")
                .help("declare it, e.g. `target y: [1]`, and pass its name"))
            }
        };
        let ps = self.shape_of(pred).clone();
        let ValueRef::Target(ti) = target else {
            return Err(err(Kind::Training, tspan, "not a target"));
        };
        let t = self.targets[ti].clone();
        match kind {
            LossKind::Mse => {
                if t.dtype == DType::I32 {
                    return Err(err(Kind::Training, tspan, format!("`mse` needs a float target, but `{}` is declared `int`", t.name))
                        .label("integer labels")
                        .note(t.span, "declared here")
                        .help("use `cross_entropy` for class labels, or declare the target with a shape like `[1]`"));
                }
                if ps != t.shape {
                    return Err(err(Kind::Shape, pspan, format!("`mse` compares a prediction of shape {} with a target of shape {}", fmt_shape(&ps), fmt_shape(&t.shape)))
                        .label(format!("prediction is {}", fmt_shape(&ps)))
                        .note(t.span, format!("target is {}", fmt_shape(&t.shape)))
                        .help("make the last layer produce the target's shape (e.g. `dense(1)` for `[1]`)"));
                }
            }
            LossKind::CrossEntropy => {
                if t.dtype != DType::I32 {
                    return Err(err(Kind::Training, tspan, format!("`cross_entropy` needs integer class labels, but `{}` is a float target", t.name))
                        .label("float target")
                        .note(t.span, "declared here")
                        .help(format!("declare it as `target {}: int`", t.name)));
                }
                if !(t.shape.is_empty() || t.shape == [1]) {
                    return Err(err(
                        Kind::Shape,
                        t.span,
                        format!(
                            "class labels must be one integer per sample, but `{}` is {}",
                            t.name,
                            fmt_shape(&t.shape)
                        ),
                    )
                    .label("wrong label shape")
                    .help(format!("declare it as `target {}: int`", t.name)));
                }
                if ps.len() != 1 {
                    return Err(err(Kind::Shape, pspan, format!("`cross_entropy` expects logits of shape [classes], got {}", fmt_shape(&ps)))
                        .label(format!("prediction is {}", fmt_shape(&ps)))
                        .help("end the network with `|> flatten |> dense(classes)` or `|> global_avgpool |> dense(classes)`"));
                }
                if ps[0] < 2 {
                    return Err(err(
                        Kind::Shape,
                        pspan,
                        "`cross_entropy` needs at least 2 classes, the prediction has 1",
                    )
                    .label("one logit")
                    .help("use `mse` (or a `sigmoid` output) for a single output"));
                }
            }
        }
        Ok(Loss {
            kind,
            pred,
            target,
            span: l.span,
        })
    }

    fn const_eval(&self, e: &Expr) -> Result<Val, Error> {
        match &e.kind {
            ExprKind::Int(i) => Ok(Val::Int(*i)),
            ExprKind::Float(f) => Ok(Val::Float(*f)),
            ExprKind::Name(n) => Ok(Val::Sym(n.clone())),
            ExprKind::Tuple(items) => {
                let mut out = vec![];
                for it in items {
                    out.push((self.const_eval(it)?, it.span));
                }
                Ok(Val::Tuple(out))
            }
            _ => Err(err(Kind::Training, e.span, "expected a constant here")
                .label("not a number or name")),
        }
    }

    fn train(&self, t: &TrainSection) -> Result<TrainConfig, Error> {
        const FIELDS: &[&str] = &["batch", "optimizer", "epochs", "seed"];
        let mut seen: HashMap<&str, &Field> = HashMap::new();
        for f in &t.fields {
            let Some(key) = FIELDS.iter().find(|k| **k == f.name.name) else {
                let mut e = err(
                    Kind::Training,
                    f.name.span,
                    format!("unknown train setting `{}`", f.name.name),
                )
                .label("unknown setting");
                e = match suggest(&f.name.name, FIELDS.iter().copied()) {
                    Some(s) => e.help(format!(
                        "did you mean `{s}`? the settings are: batch, optimizer, epochs, seed"
                    )),
                    None => e.help("the settings are: batch, optimizer, epochs, seed"),
                };
                return Err(e);
            };
            if let Some(prev) = seen.get(key) {
                return Err(
                    err(Kind::Training, f.name.span, format!("`{key}` is set twice"))
                        .label("set again here")
                        .note(prev.name.span, "first set here"),
                );
            }
            seen.insert(key, f);
        }
        let missing = |k: &str, ex: &str| {
            err(
                Kind::Training,
                t.span,
                format!("the train section has no `{k}`"),
            )
            .label(format!("`{k}` missing"))
            .help(format!("add `{k}: {ex}`"))
        };
        let int_field = |k: &str, min: i64| -> Result<Option<i64>, Error> {
            let Some(f) = seen.get(k) else {
                return Ok(None);
            };
            match self.const_eval(&f.value)? {
                Val::Int(i) if i >= min => Ok(Some(i)),
                Val::Int(i) => Err(err(
                    Kind::Training,
                    f.value.span,
                    format!("`{k}` must be at least {min}, found {i}"),
                )
                .label("out of range")),
                other => Err(err(
                    Kind::Training,
                    f.value.span,
                    format!("`{k}` must be a whole number, found {}", describe(&other)),
                )
                .label("expected an integer")),
            }
        };
        let batch = int_field("batch", 1)?.ok_or_else(|| missing("batch", "32"))?;
        if batch > MAX_DIM {
            let s = seen.get("batch").map_or(t.span, |f| f.value.span);
            return Err(err(Kind::Training, s, "batch size is too large").label("too large"));
        }
        let epochs = int_field("epochs", 1)?.map(|e| e as usize);
        let seed = int_field("seed", 0)?.map(|s| s as u64);
        let Some(of) = seen.get("optimizer") else {
            return Err(missing("optimizer", "sgd(lr: 0.01)"));
        };
        let optimizer = self.optimizer(&of.value)?;
        Ok(TrainConfig {
            batch: batch as usize,
            optimizer,
            epochs,
            seed,
        })
    }

    fn optimizer(&self, e: &Expr) -> Result<Optimizer, Error> {
        let (func, args): (Ident, &[Arg]) = match &e.kind {
            ExprKind::Name(n) => (
                Ident {
                    name: n.clone(),
                    span: e.span,
                },
                &[],
            ),
            ExprKind::Call {
                func,
                args,
                label: None,
            } => (func.clone(), args.as_slice()),
            _ => {
                return Err(err(
                    Kind::Training,
                    e.span,
                    "expected an optimizer such as `sgd(lr: 0.01)` or `adam(lr: 0.001)`",
                )
                .label("not an optimizer"))
            }
        };
        let params: &'static [(&'static str, bool)] = match func.name.as_str() {
            "sgd" => &[
                ("lr", true),
                ("momentum", true),
                ("weight_decay", true),
                ("nesterov", true),
            ],
            "adam" | "adamw" => &[
                ("lr", true),
                ("betas", true),
                ("beta1", true),
                ("beta2", true),
                ("eps", true),
                ("weight_decay", true),
            ],
            other => {
                let mut er = err(
                    Kind::Training,
                    func.span,
                    format!("unknown optimizer `{other}`"),
                )
                .label("not an optimizer");
                er = match suggest(other, OPTIMIZERS.iter().copied()) {
                    Some(s) => er.help(format!(
                        "did you mean `{s}`? the optimizers are sgd, adam and adamw"
                    )),
                    None => er.help("the optimizers are sgd, adam and adamw"),
                };
                return Err(er);
            }
        };
        let op: &'static str = OPTIMIZERS
            .iter()
            .copied()
            .find(|o| *o == func.name)
            .unwrap_or("sgd");
        let sig = Sig { op, params };
        let mut positional = vec![];
        let mut kw = vec![];
        for a in args {
            let v = self.const_eval(&a.value)?;
            match &a.name {
                Some(n) => kw.push((n, v, a.value.span)),
                None => {
                    if !kw.is_empty() {
                        return Err(err(
                            Kind::Argument,
                            a.span,
                            "positional argument after a keyword argument",
                        )
                        .label("positional"));
                    }
                    if !positional.is_empty() {
                        return Err(err(
                            Kind::Argument,
                            a.value.span,
                            format!("`{op}` takes only the learning rate positionally"),
                        )
                        .label("unexpected argument")
                        .help("name the other settings, e.g. `momentum: 0.9`"));
                    }
                    positional.push((v, a.value.span));
                }
            }
        }
        let b = self.bind(&sig, positional, kw, &func, e.span)?;
        let range = |k: &str, v: f64, lo: f64, hi: f64, incl_lo: bool| -> Result<(), Error> {
            let ok = (if incl_lo { v >= lo } else { v > lo }) && v < hi;
            if ok {
                return Ok(());
            }
            let s = b.get(k).map_or(e.span, |x| x.1);
            let what = match (hi.is_infinite(), incl_lo) {
                (true, false) => "positive".to_string(),
                (true, true) => "zero or positive".to_string(),
                (false, true) => format!("in [{lo}, {hi})"),
                (false, false) => format!("in ({lo}, {hi})"),
            };
            Err(err(
                Kind::Training,
                s,
                format!("`{k}` must be {what}, found {v:?}"),
            )
            .label("out of range"))
        };
        // A value the check accepts must survive the conversion to f32 the update uses (1e39 is
        // infinite there, 1e-50 zero).
        let as_f32 = |k: &str, v: f64| -> Result<f32, Error> {
            let f = v as f32;
            if f.is_finite() && (v == 0.0 || f != 0.0) {
                return Ok(f);
            }
            let s = b.get(k).map_or(e.span, |x| x.1);
            Err(err(
                Kind::Training,
                s,
                format!("`{k}` = {v:?} does not fit in f32 (it would become {f})"),
            )
            .label("out of f32 range")
            .help(format!(
                "use a value between {:e} and {:e}",
                f32::MIN_POSITIVE,
                f32::MAX
            )))
        };
        let lr_default = if op == "sgd" { 0.01 } else { 0.001 };
        let lr = b.float("lr", lr_default)?;
        range("lr", lr, 0.0, f64::INFINITY, false)?;
        let lr = LearningRate::new(lr).map_err(|reason| {
            let s = b.get("lr").map_or(e.span, |x| x.1);
            err(Kind::Training, s, reason)
                .label("unusable learning rate")
                .help(format!(
                    "use a value between {:e} and {:e}, typically 1e-4 to 0.1",
                    f32::MIN_POSITIVE,
                    f32::MAX
                ))
        })?;
        let lr = lr.get();
        if op == "sgd" {
            let momentum = b.float("momentum", 0.0)?;
            range("momentum", momentum, 0.0, 1.0, true)?;
            let weight_decay = b.float("weight_decay", 0.0)?;
            range("weight_decay", weight_decay, 0.0, f64::INFINITY, true)?;
            let nesterov = b.boolean("nesterov", false)?;
            if nesterov && momentum == 0.0 {
                let s = b.get("nesterov").map_or(e.span, |x| x.1);
                return Err(err(
                    Kind::Training,
                    s,
                    "Nesterov momentum needs a non-zero `momentum`",
                )
                .label("nesterov without momentum")
                .help("add e.g. `momentum: 0.9`"));
            }
            return Ok(Optimizer::Sgd {
                lr: lr as f32,
                momentum: as_f32("momentum", momentum)?,
                weight_decay: as_f32("weight_decay", weight_decay)?,
                nesterov,
            });
        }
        let (mut beta1, mut beta2) = (0.9, 0.999);
        if let Some((v, s)) = b.get("betas") {
            if b.get("beta1").is_some() || b.get("beta2").is_some() {
                return Err(err(
                    Kind::Training,
                    *s,
                    "give either `betas` or `beta1`/`beta2`, not both",
                )
                .label("conflicting settings"));
            }
            match v {
                Val::Tuple(items) if items.len() == 2 => {
                    let num = |(v, s): &(Val, Span)| match v {
                        Val::Int(i) => Ok(*i as f64),
                        Val::Float(f) => Ok(*f),
                        other => Err(err(
                            Kind::Training,
                            *s,
                            format!("expected a number, found {}", describe(other)),
                        )
                        .label("not a number")),
                    };
                    beta1 = num(&items[0])?;
                    beta2 = num(&items[1])?;
                }
                _ => {
                    return Err(err(Kind::Training, *s, "`betas` must be a pair of numbers")
                        .label("expected `(beta1, beta2)`")
                        .help("write `betas: (0.9, 0.999)`"))
                }
            }
            let s = *s;
            for bv in [beta1, beta2] {
                if !(0.0..1.0).contains(&bv) {
                    return Err(err(
                        Kind::Training,
                        s,
                        format!("betas must be in [0, 1), found {bv:?}"),
                    )
                    .label("out of range"));
                }
            }
        } else {
            beta1 = b.float("beta1", beta1)?;
            range("beta1", beta1, 0.0, 1.0, true)?;
            beta2 = b.float("beta2", beta2)?;
            range("beta2", beta2, 0.0, 1.0, true)?;
        }
        let eps = b.float("eps", 1e-8)?;
        range("eps", eps, 0.0, f64::INFINITY, false)?;
        let decoupled = op == "adamw";
        let weight_decay = b.float("weight_decay", if decoupled { 0.01 } else { 0.0 })?;
        range("weight_decay", weight_decay, 0.0, f64::INFINITY, true)?;
        Ok(Optimizer::Adam {
            lr: lr as f32,
            beta1: as_f32("beta1", beta1)?,
            beta2: as_f32("beta2", beta2)?,
            eps: as_f32("eps", eps)?,
            weight_decay: as_f32("weight_decay", weight_decay)?,
            decoupled,
        })
    }
}

fn activation(b: &Bound) -> Result<Option<Activation>, Error> {
    let mut choices = vec!["none"];
    choices.extend(Activation::ALL.map(Activation::name));
    Ok(Activation::from_name(b.choice(
        "activation",
        &choices,
        "none",
    )?))
}

fn act_name(a: Activation) -> &'static str {
    a.name()
}

fn example(op: &str) -> String {
    let ex = match op {
        "conv2d" => "x |> conv2d(64, 3)   # filters, kernel",
        "maxpool" => "x |> maxpool(2)",
        "avgpool" => "x |> avgpool(2)",
        "dense" => "x |> dense(10)",
        "dropout" => "x |> dropout(0.5)",
        "sgd" => "sgd(lr: 0.01, momentum: 0.9)",
        "adam" | "adamw" => "adam(lr: 0.001)",
        _ => return format!("see the reference of `{op}` in docs/LANGUAGE.md"),
    };
    format!("for example: `{ex}`")
}

/// Block names called (as calls or bare pipeline stages) inside an expression.
fn calls_in(e: &Expr, out: &mut Vec<(String, Span)>) {
    match &e.kind {
        ExprKind::Call { func, args, .. } => {
            out.push((func.name.clone(), func.span));
            for a in args {
                calls_in(&a.value, out);
            }
        }
        ExprKind::Name(n) => out.push((n.clone(), e.span)),
        ExprKind::Tuple(items) => items.iter().for_each(|i| calls_in(i, out)),
        ExprKind::Add(terms) => terms.iter().for_each(|i| calls_in(i, out)),
        ExprKind::Pipe(a, stages) => {
            calls_in(a, out);
            stages.iter().for_each(|i| calls_in(i, out));
        }
        ExprKind::Repeat { count, body } => {
            calls_in(count, out);
            body.iter().for_each(|i| calls_in(i, out));
        }
        ExprKind::Int(_) | ExprKind::Float(_) => {}
    }
}

/// Span of the last non-blank character of the source (where "missing ..." errors point).
fn last_char(src: &str) -> Span {
    let trimmed = src.trim_end();
    match trimmed.char_indices().last() {
        Some((i, c)) => Span::new(i, i + c.len_utf8()),
        None => Span::new(0, 0),
    }
}
