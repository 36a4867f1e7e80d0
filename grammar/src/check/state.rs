//! The checker's state: the declarations and nodes emitted so far, the blocks of the program, the
//! frames of block instances and `repeat`s, and how emitted layers are named.

use crate::ast::{BlockDef, Ident};
use crate::diag::{Error, Kind};
use crate::limits::{elems, MAX_NODES, MAX_STEPS};
use crate::model::*;
use std::collections::{HashMap, HashSet};

pub(super) struct Frame {
    /// Prefix of user-given layer names in this block instance, e.g. `res_1.` (empty at top level).
    pub(super) prefix: String,
    /// 1-based iteration numbers of the enclosing `repeat`s within this frame.
    pub(super) repeat: Vec<usize>,
}

pub(super) struct Checker<'a> {
    pub(super) inputs: Vec<TensorDecl>,
    pub(super) targets: Vec<TensorDecl>,
    pub(super) nodes: Vec<Node>,
    /// Automatic names given so far per layer (`conv2d_3`).
    pub(super) counters: HashMap<String, usize>,
    /// Where each layer name (and named block instance) was given.
    pub(super) node_names: HashMap<String, Span>,
    pub(super) blocks: HashMap<String, &'a BlockDef>,
    pub(super) frames: Vec<Frame>,
    pub(super) steps: usize,
    /// The last character of the source (where "missing ..." errors point).
    pub(super) eof: Span,
    /// The errors found so far (checking goes on after an error, see [`Checker::recover`]).
    pub(super) errors: Vec<Error>,
    /// Set when checking cannot usefully go on (the network is too large, or too many errors):
    /// every further step fails as a follow-on error.
    pub(super) stop: bool,
    /// The program's top-level values, inputs and targets with where they are defined (a block
    /// does not see them: said so when a block uses one).
    pub(super) top_names: HashMap<String, Span>,
    /// Blocks whose definition is in error (recursive): their uses are not expanded.
    pub(super) broken_blocks: HashSet<String>,
    /// The errors recorded, by place and message: one found again (in another use of a block)
    /// is not recorded twice.
    seen: HashSet<(usize, usize, String)>,
    /// Every name the program's expressions mention: after an error, a value is reported as
    /// unused only when it is mentioned nowhere (else the error is why it seems unused).
    pub(super) mentioned: HashSet<String>,
    /// Checking the stages of a pipeline whose input is in error: their names and arguments are
    /// checked, but nothing is built (their input is [`NO_VALUE`]).
    pub(super) detached: bool,
}

/// The stand-in input of a call whose input is in error (see [`Checker::detached`]); it has no
/// shape, and no layer is built from it.
pub(super) const NO_VALUE: ValueRef = ValueRef::Input(usize::MAX);

/// The shape of [`NO_VALUE`].
static NO_SHAPE: Shape = Vec::new();

/// Errors collected before checking stops (only [`crate::diag::MAX_SHOWN`] are shown; the rest
/// are counted).
const MAX_ERRORS: usize = crate::diag::MAX_COLLECTED;

pub(super) fn err(kind: Kind, span: Span, msg: impl Into<String>) -> Error {
    Error::new(kind, span, msg)
}

impl<'a> Checker<'a> {
    pub(super) fn new(eof: Span) -> Self {
        Checker {
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
            eof,
            errors: vec![],
            stop: false,
            top_names: HashMap::new(),
            broken_blocks: HashSet::new(),
            seen: HashSet::new(),
            mentioned: HashSet::new(),
            detached: false,
        }
    }

    /// Records an error and goes on: the value of a failed step is `None`. Follow-on errors are
    /// dropped (their cause is reported).
    pub(super) fn recover<T>(&mut self, r: Result<T, Error>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.report(e);
                None
            }
        }
    }

    /// Records an error (not a follow-on one).
    pub(super) fn report(&mut self, e: Error) {
        if e.is_follow_on()
            || !self
                .seen
                .insert((e.span.start, e.span.end, e.message.clone()))
        {
            return;
        }
        self.errors.push(e);
        if self.errors.len() >= MAX_ERRORS {
            self.stop = true;
        }
    }

    pub(super) fn step(&mut self, span: Span) -> Result<(), Error> {
        if self.stop {
            return Err(Error::follow_on(span));
        }
        self.steps += 1;
        if self.steps > MAX_STEPS || self.nodes.len() > MAX_NODES {
            self.stop = true;
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

    /// Whether `v` is an integer value (a declared `int` input or target).
    pub(super) fn is_int(&self, v: ValueRef) -> bool {
        let decl = match v {
            ValueRef::Input(i) => self.inputs.get(i),
            ValueRef::Target(i) => self.targets.get(i),
            ValueRef::Node(_) => None,
        };
        decl.is_some_and(|d| d.dtype == crate::model::DType::I32)
    }

    pub(super) fn shape_of(&self, v: ValueRef) -> &Shape {
        let shape = match v {
            ValueRef::Input(i) => self.inputs.get(i).map(|d| &d.shape),
            ValueRef::Target(i) => self.targets.get(i).map(|d| &d.shape),
            ValueRef::Node(i) => self.nodes.get(i).map(|n| &n.shape),
        };
        shape.unwrap_or(&NO_SHAPE)
    }

    pub(super) fn frame(&mut self) -> &mut Frame {
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
    pub(super) fn qualify(&mut self, label: &str) -> String {
        let f = self.frame();
        let mut s = format!("{}{}", f.prefix, label);
        for i in &f.repeat {
            s.push_str(&format!("_{i}"));
        }
        s
    }

    pub(super) fn auto_name(&mut self, kind: &str) -> String {
        let c = self.counters.entry(kind.to_string()).or_insert(0);
        *c += 1;
        format!("{kind}_{c}")
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn push_node(
        &mut self,
        name: String,
        name_span: Span,
        layer: Layer,
        inputs: Vec<ValueRef>,
        shape: Shape,
        params: Vec<ParamSpec>,
        span: Span,
    ) -> Result<ValueRef, Error> {
        elems(&shape, span)?;
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
            self.stop = true;
            return Err(err(
                Kind::Argument,
                span,
                format!("the expanded network is too large (more than {MAX_NODES} layers)"),
            )
            .label("expanding this exceeds the limit"));
        }
        Ok(ValueRef::Node(self.nodes.len() - 1))
    }

    pub(super) fn layer_name(
        &mut self,
        kind: &str,
        label: Option<&Ident>,
    ) -> (String, Option<Span>) {
        match label {
            Some(l) => (self.qualify(&l.name), Some(l.span)),
            None => (self.auto_name(kind), None),
        }
    }
}
