//! Blocks: collecting the `block` definitions (no redefinition of built-ins, no recursion) and
//! expanding a use of one inline, with its own scope and layer-name prefix.

use super::names::is_builtin;
use super::scope::{describe, is_option_word, Scope, Val};
use super::state::{err, Checker, Frame};
use crate::ast::*;
use crate::diag::{Error, Kind};
use crate::limits::MAX_BLOCK_DEPTH;
use crate::model::{Span, ValueRef};
use std::collections::{HashMap, HashSet};

impl<'a> Checker<'a> {
    /// Collects the blocks, recording the errors of their definitions: a block named like a
    /// built-in or defined again is left out, a recursive one is marked broken.
    pub(super) fn collect_blocks(&mut self, prog: &'a Program) {
        for item in &prog.items {
            let Item::Block(b) = item else { continue };
            if is_builtin(&b.name.name) {
                self.report(
                    err(
                        Kind::Name,
                        b.name.span,
                        format!("`{}` is a built-in name", b.name.name),
                    )
                    .label("cannot be redefined")
                    .help("choose another name for the block"),
                );
                continue;
            }
            if let Some(prev) = self.blocks.get(&b.name.name) {
                let e = err(
                    Kind::Name,
                    b.name.span,
                    format!("block `{}` is defined twice", b.name.name),
                )
                .label("second definition")
                .note(prev.name.span, "first definition");
                self.report(e);
                continue;
            }
            let mut seen: HashMap<&str, Span> = HashMap::new();
            for p in &b.params {
                if let Some(prev) = seen.insert(&p.name.name, p.name.span) {
                    self.report(
                        err(
                            Kind::Name,
                            p.name.span,
                            format!("parameter `{}` appears twice", p.name.name),
                        )
                        .label("duplicate parameter")
                        .note(prev, "first here"),
                    );
                }
            }
            self.blocks.insert(b.name.name.clone(), b);
        }
        // Recursion: depth-first search over the call graph.
        let mut names: Vec<&String> = self.blocks.keys().collect();
        names.sort();
        let mut done: HashSet<String> = HashSet::new();
        let mut broken: HashSet<String> = HashSet::new();
        let mut found = vec![];
        for n in names {
            let mut stack = vec![];
            if let Err(e) = self.find_cycle(n, &mut stack, &mut done) {
                // Every block of the cycle is broken (and reported once).
                broken.insert(n.clone());
                broken.extend(stack.into_iter().map(|(s, _)| s));
                done.extend(broken.iter().cloned());
                found.push(e);
            }
        }
        found.into_iter().for_each(|e| self.report(e));
        self.broken_blocks = broken;
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

    /// Expands a use of block `b`. In a pipeline whose input is in error (see
    /// [`Checker::detached`]) the piped parameter is a value in error and the body is checked
    /// for what does not depend on it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn expand_block(
        &mut self,
        b: &'a BlockDef,
        func: &Ident,
        args: &[Arg],
        label: Option<&Ident>,
        piped: Option<ValueRef>,
        span: Span,
        scope: &mut Scope,
    ) -> Result<Val, Error> {
        let detached = std::mem::replace(&mut self.detached, false);
        let piped = match piped {
            Some(_) if detached => Some(Val::Poison),
            Some(p) => Some(Val::Tensor(p)),
            None => None,
        };
        let r = self.expand(b, func, args, label, piped, span, scope);
        self.detached = detached;
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn expand(
        &mut self,
        b: &'a BlockDef,
        func: &Ident,
        args: &[Arg],
        label: Option<&Ident>,
        piped: Option<Val>,
        span: Span,
        scope: &mut Scope,
    ) -> Result<Val, Error> {
        let bname = &b.name.name;
        if self.broken_blocks.contains(bname) {
            // Its definition is reported.
            return Err(Error::follow_on(func.span));
        }
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
        if let Some(p) = piped.clone() {
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
            vals[0] = Some((p, func.span));
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
                        if !is_option_word(name) {
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
        let mark = self.errors.len();
        let res = self.block_body(b, &mut inner);
        self.frames.pop();
        // An error inside the block's body: also show which use of the block it came from
        // (shapes and arguments differ between uses).
        let in_use = |mut e: Error| {
            let inside = e.span.start >= b.span.start && e.span.end <= b.span.end;
            let uses = e
                .notes
                .iter()
                .filter(|(_, t)| t.starts_with("in this use of block"))
                .count();
            if inside && uses < 4 && !e.is_follow_on() {
                e = e.note(span, format!("in this use of block `{bname}`"));
            }
            e
        };
        let found: Vec<Error> = self.errors.drain(mark..).map(in_use).collect();
        self.errors.extend(found);
        let v = res.map_err(in_use)?;
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

    /// The body of a block instance: each statement in error is recorded (and its value poisoned),
    /// the others are checked on; the error of the `return` is returned.
    fn block_body(&mut self, b: &'a BlockDef, inner: &mut Scope) -> Result<Val, Error> {
        for l in &b.body {
            if self.stop {
                return Err(Error::follow_on(l.span));
            }
            let r = self.block_stmt(b, l, inner);
            if self.recover(r).is_none() {
                inner.mark_used(&l.value);
                inner.poison(&l.name, "value");
            }
        }
        let v = self.eval(&b.ret, inner)?;
        let v = match v {
            Val::Tensor(r) => Val::Tensor(r),
            Val::Poison => Val::Poison,
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
        self.check_unused(inner, &format!(" in block `{}`", b.name.name));
        Ok(v)
    }

    /// One statement `name = value` of a block's body.
    fn block_stmt(&mut self, b: &'a BlockDef, l: &'a Let, inner: &mut Scope) -> Result<(), Error> {
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
        inner.define(&l.name, v, "value")
    }
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
        ExprKind::Add(terms) | ExprKind::Mul(terms) => terms.iter().for_each(|i| calls_in(i, out)),
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
