//! Lints on the whole expanded program: every value is used, every layer contributes to the
//! loss, and something is trainable.

use super::scope::{Scope, Val};
use super::state::{err, Checker};
use crate::diag::{Error, Kind};
use crate::model::{Loss, ValueRef};

impl Checker<'_> {
    /// Reports every value, input and target of `scope` that is never used (but not those whose
    /// definition is in error, nor, after an error, those the program mentions).
    pub(super) fn check_unused(&mut self, scope: &Scope, where_: &str) {
        for n in &scope.order {
            let Some(b) = scope.vars.get(n) else { continue };
            if b.used || b.val == Val::Poison {
                continue;
            }
            if !self.errors.is_empty() && self.mentioned.contains(n) {
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
            self.report(
                err(Kind::Name, b.span, msg)
                    .label("defined here but never used")
                    .help(help),
            );
        }
    }

    /// Every layer must contribute to the loss' prediction.
    pub(super) fn check_dead(&self, preds: &[ValueRef]) -> Result<(), Error> {
        let mut live = vec![false; self.nodes.len()];
        for p in preds {
            if let ValueRef::Node(i) = p {
                live[*i] = true;
            }
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

    /// The model must have a parameter to train.
    pub(super) fn check_trainable(&self, loss: &Loss) -> Result<(), Error> {
        if self.nodes.iter().all(|n| n.params.is_empty()) {
            return Err(err(
                Kind::Training,
                loss.span,
                "the model has no trainable parameters",
            )
            .label("nothing to train for this loss")
            .help("add a layer with weights, e.g. `dense(...)` or `conv2d(...)`"));
        }
        Ok(())
    }
}
