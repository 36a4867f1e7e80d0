//! `dmc summary`: a Keras-like table of layers, output shapes, parameter counts and fp32 bytes.

use crate::model::*;
use serde_json::json;
use thousands::Separable;

/// Bytes per element (fp32).
const F32: usize = 4;

/// `826152612` -> `826,152,612 bytes (787.9 MiB)`.
pub fn bytes_text(n: usize) -> String {
    format!(
        "{} bytes ({})",
        n.separate_with_commas(),
        bytesize::ByteSize(n as u64).display().iec()
    )
}

/// Keras-style type name of a layer (from the layer table).
pub fn layer_type(layer: &Layer) -> &'static str {
    crate::layers::summary_type(layer)
}

/// One row of the summary.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub name: String,
    pub kind: &'static str,
    /// Output shape including the batch dimension.
    pub shape: Vec<usize>,
    pub params: usize,
    pub output_bytes: usize,
    pub param_bytes: usize,
    /// Names of the values it reads (inputs or layers).
    pub inputs: Vec<String>,
}

/// Totals of the summary.
#[derive(Debug, Clone, PartialEq)]
pub struct Totals {
    pub params: usize,
    pub param_bytes: usize,
    /// Sum of all layer outputs of one forward pass at the model's batch size.
    pub activation_bytes: usize,
    pub input_bytes: usize,
}

fn value_name(m: &Model, v: ValueRef) -> String {
    match v {
        ValueRef::Input(i) => m.inputs[i].name.clone(),
        ValueRef::Target(i) => m.targets[i].name.clone(),
        ValueRef::Node(i) => m.nodes[i].name.clone(),
    }
}

/// Rows and totals of a model's summary.
pub fn summary_rows(model: &Model) -> (Vec<Row>, Totals) {
    let batch = model.train.batch;
    let mut rows = vec![];
    let mut totals = Totals {
        params: 0,
        param_bytes: 0,
        activation_bytes: 0,
        input_bytes: 0,
    };
    for n in &model.nodes {
        let params: usize = n
            .params
            .iter()
            .map(|p| p.shape.iter().product::<usize>())
            .sum();
        let elems: usize = n.shape.iter().product::<usize>();
        let mut shape = vec![batch];
        shape.extend(&n.shape);
        let row = Row {
            name: n.name.clone(),
            kind: layer_type(&n.layer),
            shape,
            params,
            output_bytes: elems.saturating_mul(batch).saturating_mul(F32),
            param_bytes: params.saturating_mul(F32),
            inputs: n.inputs.iter().map(|v| value_name(model, *v)).collect(),
        };
        totals.params = totals.params.saturating_add(row.params);
        totals.param_bytes = totals.param_bytes.saturating_add(row.param_bytes);
        totals.activation_bytes = totals.activation_bytes.saturating_add(row.output_bytes);
        rows.push(row);
    }
    for i in &model.inputs {
        let bytes = i
            .shape
            .iter()
            .product::<usize>()
            .saturating_mul(batch)
            .saturating_mul(F32);
        totals.input_bytes = totals.input_bytes.saturating_add(bytes);
    }
    (rows, totals)
}

fn shape_text(s: &[usize]) -> String {
    format!(
        "({})",
        s.iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

fn optimizer_text(o: &Optimizer) -> String {
    match *o {
        Optimizer::Sgd {
            lr,
            momentum,
            weight_decay,
            nesterov,
            ..
        } => {
            format!("sgd(lr: {lr}, momentum: {momentum}, weight_decay: {weight_decay}, nesterov: {nesterov})")
        }
        Optimizer::Adam {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            decoupled,
            ..
        } => format!(
            "{}(lr: {lr}, betas: ({beta1}, {beta2}), eps: {eps:e}, weight_decay: {weight_decay})",
            if decoupled { "adamw" } else { "adam" }
        ),
        Optimizer::RmsProp {
            lr,
            alpha,
            eps,
            weight_decay,
            momentum,
            ..
        } => format!(
            "rmsprop(lr: {lr}, alpha: {alpha}, eps: {eps:e}, weight_decay: {weight_decay}, momentum: {momentum})"
        ),
        Optimizer::Lion {
            lr,
            beta1,
            beta2,
            weight_decay,
            ..
        } => format!("lion(lr: {lr}, betas: ({beta1}, {beta2}), weight_decay: {weight_decay})"),
    }
}

/// The loss as the program would write it: its terms, each with its weight when it is not 1.
fn loss_text(m: &Model) -> String {
    let terms: Vec<String> = m.loss.terms.iter().map(|t| term_text(m, t)).collect();
    terms.join(" + ")
}

fn term_text(m: &Model, t: &LossTerm) -> String {
    let k = t.kind.name();
    let opt = match t.kind {
        LossKind::Huber { delta } => format!(", delta: {delta}"),
        LossKind::CrossEntropy { label_smoothing } if label_smoothing != 0.0 => {
            format!(", label_smoothing: {label_smoothing}")
        }
        LossKind::Mse | LossKind::Mae | LossKind::BceWithLogits | LossKind::CrossEntropy { .. } => {
            String::new()
        }
    };
    let w = if t.weight == 1.0 {
        String::new()
    } else {
        format!("{} * ", t.weight)
    };
    format!(
        "{w}{k}({}, {}{opt})",
        value_name(m, t.pred),
        value_name(m, t.target)
    )
}

/// Names longer than this are shortened in the middle in the text table (the JSON has them whole).
pub const TABLE_NAME_CHARS: usize = 60;

/// A layer name as shown in the text table: at most [`TABLE_NAME_CHARS`] characters.
fn table_name(name: &str) -> String {
    let n = name.chars().count();
    if n <= TABLE_NAME_CHARS {
        return name.to_string();
    }
    let head: String = name.chars().take(TABLE_NAME_CHARS * 2 / 3).collect();
    let tail: String = name
        .chars()
        .skip(n - (TABLE_NAME_CHARS - TABLE_NAME_CHARS * 2 / 3 - 1))
        .collect();
    format!("{head}…{tail}")
}

/// The summary as a text table (like Keras' `model.summary()`), with fp32 byte counts.
pub fn summary_text(model: &Model) -> String {
    let (rows, t) = summary_rows(model);
    let headers = [
        "Layer (type)",
        "Output shape",
        "Param #",
        "Output bytes",
        "Param bytes",
    ];
    let cells: Vec<[String; 5]> = rows
        .iter()
        .map(|r| {
            [
                format!("{} ({})", table_name(&r.name), r.kind),
                shape_text(&r.shape),
                r.params.separate_with_commas(),
                r.output_bytes.separate_with_commas(),
                r.param_bytes.separate_with_commas(),
            ]
        })
        .collect();
    // Models that are not a simple chain get a "Connected to" column (as Keras' functional models).
    let chain = model.nodes.iter().enumerate().all(|(i, n)| {
        let prev = if i == 0 {
            ValueRef::Input(0)
        } else {
            ValueRef::Node(i - 1)
        };
        n.inputs == [prev]
    });
    let ncols = if chain { 5 } else { 6 };
    let mut table: Vec<Vec<String>> = vec![];
    let mut head: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    if !chain {
        head.push("Connected to".to_string());
    }
    table.push(head);
    for (c, r) in cells.iter().zip(&rows) {
        let mut row = c.to_vec();
        if !chain {
            let inputs: Vec<String> = r.inputs.iter().map(|n| table_name(n)).collect();
            row.push(inputs.join(", "));
        }
        table.push(row);
    }
    let mut w = vec![0usize; ncols];
    for row in &table {
        for (i, s) in row.iter().enumerate() {
            w[i] = w[i].max(s.chars().count());
        }
    }
    let total_w: usize = w.iter().sum::<usize>() + 2 * (ncols - 1);
    let line = |ch: char| ch.to_string().repeat(total_w);
    let fmt_row = |c: &Vec<String>| {
        let mut t = String::new();
        for (i, cell) in c.iter().enumerate() {
            if i > 0 {
                t.push_str("  ");
            }
            // Names, shapes and connections are left-aligned; numbers right-aligned. (Padded by
            // hand: `format!` widths are limited to 65,535.)
            let pad = " ".repeat(w[i].saturating_sub(cell.chars().count()));
            if matches!(i, 0 | 1 | 5) {
                t.push_str(cell);
                t.push_str(&pad);
            } else {
                t.push_str(&pad);
                t.push_str(cell);
            }
        }
        t.trim_end().to_string()
    };
    let mut out = String::new();
    let ins: Vec<String> = model
        .inputs
        .iter()
        .map(|i| {
            format!(
                "{}: {}",
                i.name,
                shape_text(&[vec![model.train.batch], i.shape.clone()].concat())
            )
        })
        .collect();
    out.push_str(&format!(
        "Inputs: {}   (batch {})\n",
        ins.join(", "),
        model.train.batch
    ));
    out.push_str(&line('_'));
    out.push('\n');
    out.push_str(&fmt_row(&table[0]));
    out.push('\n');
    out.push_str(&line('='));
    out.push('\n');
    for row in &table[1..] {
        out.push_str(&fmt_row(row));
        out.push('\n');
    }
    out.push_str(&line('='));
    out.push('\n');
    out.push_str(&format!("Layers:             {}\n", rows.len()));
    out.push_str(&format!(
        "Total params:       {}\n",
        t.params.separate_with_commas()
    ));
    out.push_str(&format!(
        "Param bytes (fp32): {}\n",
        bytes_text(t.param_bytes)
    ));
    out.push_str(&format!(
        "Activation bytes:   {}  (one forward pass at batch {}, sum of all layer outputs)\n",
        bytes_text(t.activation_bytes),
        model.train.batch
    ));
    out.push_str(&format!("Loss:               {}\n", loss_text(model)));
    out.push_str(&format!(
        "Optimizer:          {}\n",
        optimizer_text(&model.train.optimizer)
    ));
    if !model.train.schedule.is_constant() {
        out.push_str(&format!(
            "Learning rate:      {}\n",
            model.train.schedule.describe()
        ));
    }
    if let Some(g) = gradients_text(model) {
        out.push_str(&format!("Gradients:          {g}\n"));
    }
    let inits = chosen_inits(model);
    if !inits.is_empty() {
        let list: Vec<String> = inits.iter().map(|(p, i)| format!("{p} {i}")).collect();
        out.push_str(&format!(
            "Initialisers:       {}  (the other parameters: dmc's default)\n",
            list.join(", ")
        ));
    }
    out
}

/// What is done to the gradients before the optimizer uses them (`accumulate`, `clip_value`), if
/// anything.
fn gradients_text(model: &Model) -> Option<String> {
    let mut parts = vec![];
    let n = model.train.accumulate;
    if n > 1 {
        parts.push(format!(
            "accumulated over {n} micro-batches of {} (effective batch {})",
            model.train.batch,
            model.train.batch * n
        ));
    }
    if let Some(m) = model.train.optimizer.clip_norm() {
        parts.push(format!(
            "scaled to a global L2 norm of at most {m} (clip_norm)"
        ));
    }
    if let Some(v) = model.train.optimizer.clip_value() {
        parts.push(format!("each element clipped to [-{v}, {v}] (clip_value)"));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// The parameters whose layer chose an initialiser (`init:` / `bias_init:`), in model order,
/// with the initialiser as written.
fn chosen_inits(model: &Model) -> Vec<(String, String)> {
    model
        .nodes
        .iter()
        .flat_map(|n| &n.params)
        .filter_map(|p| p.init.map(|i| (p.name.clone(), i.text())))
        .collect()
}

/// The summary as JSON (same content as [`summary_text`]).
pub fn summary_json(model: &Model) -> serde_json::Value {
    let (rows, t) = summary_rows(model);
    let layers: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            json!({
                "name": r.name,
                "type": r.kind,
                "output_shape": r.shape,
                "params": r.params,
                "output_bytes": r.output_bytes,
                "param_bytes": r.param_bytes,
                "inputs": r.inputs,
            })
        })
        .collect();
    json!({
        "batch": model.train.batch,
        "inputs": model.inputs.iter().map(|i| json!({"name": i.name, "shape": i.shape})).collect::<Vec<_>>(),
        "layers": layers,
        "initializers": chosen_inits(model)
            .into_iter()
            .map(|(p, i)| (p, serde_json::Value::String(i)))
            .collect::<serde_json::Map<_, _>>(),
        "total_params": t.params,
        "param_bytes": t.param_bytes,
        "activation_bytes": t.activation_bytes,
        "loss": loss_text(model),
        "optimizer": optimizer_text(&model.train.optimizer),
        "lr_schedule": model.train.schedule.describe(),
        "clip_value": model.train.optimizer.clip_value(),
        "clip_norm": model.train.optimizer.clip_norm(),
        "accumulate": model.train.accumulate,
    })
}
