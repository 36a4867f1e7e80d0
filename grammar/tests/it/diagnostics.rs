//! The catalogue of malformed programs: each one's rendered diagnostic is pinned by a snapshot.

use dmc_grammar::{compile_source, render_plain};

const HEAD: &str = "input x: [16, 16, 1]\ntarget y: [1]\n";
const TAIL: &str = "loss mse(out, y)\ntrain { batch: 1, optimizer: sgd(lr: 0.01) }\n";

/// Programs with the common header and footer around a body.
fn wrap(body: &str) -> String {
    format!("{HEAD}{body}\n{TAIL}")
}

fn cases() -> Vec<(&'static str, String)> {
    vec![
        // --- syntax ---
        ("unclosed_call", wrap("out = x |> conv2d(8, 3 |> flatten |> dense(1)")),
        ("unclosed_call_eof", "input x: [4]\ntarget y: [1]\nout = x |> dense(1".to_string()),
        ("unterminated_block", "input x: [4]\nblock b(x) {\n  h = x |> dense(4)\n  return h\n".to_string()),
        ("unterminated_train", format!("{HEAD}out = x |> flatten |> dense(1)\nloss mse(out, y)\ntrain {{ batch: 1, optimizer: sgd(lr: 0.01)\n")),
        ("bad_character", wrap("out = x |> flatten | dense(1)")),
        ("missing_equals", wrap("out x |> flatten |> dense(1)")),
        ("call_without_assignment", wrap("dense(x, 1)")),
        ("stage_not_an_operation", wrap("out = x |> 3")),
        ("missing_shape", "input x\ntarget y: [1]\n".to_string()),
        ("float_dimension", "input x: [16.5, 4]\n".to_string()),
        ("return_outside_block", wrap("return x")),
        ("block_without_return", wrap("block b(x) {\n  h = x |> relu\n}\nout = x |> flatten |> dense(1)")),
        ("empty_repeat", wrap("out = x |> repeat 3 { } |> flatten |> dense(1)")),
        ("keyword_as_name", wrap("loss = x |> flatten |> dense(1)")),
        ("number_too_large", wrap("out = x |> conv2d(99999999999999999999, 3)")),
        // --- names ---
        ("unknown_op", wrap("out = x |> conv2(8, 3) |> flatten |> dense(1)")),
        ("unknown_name", wrap("out = h |> flatten |> dense(1)")),
        ("name_defined_later", wrap("out = h |> dense(1)\nh = x |> flatten")),
        ("duplicate_value", wrap("h = x |> flatten\nh = x |> flatten\nout = h |> dense(1)")),
        ("duplicate_layer_name", wrap("out = x |> conv2d(8, 3) as c |> conv2d(8, 3) as c |> flatten |> dense(1)")),
        ("block_recursion", wrap("block a(x) { return x |> b }\nblock b(x) { return x |> a |> relu }\nout = x |> a |> flatten |> dense(1)")),
        ("block_self_recursion", wrap("block a(x) { return x |> relu |> a }\nout = x |> a |> flatten |> dense(1)")),
        ("block_sees_no_globals", format!("{HEAD}block b(x) {{ return x + z }}\nz = x |> relu\nout = x |> b |> flatten |> dense(1)\n{TAIL}")),
        ("unused_value", wrap("h = x |> relu\nout = x |> flatten |> dense(1)")),
        ("value_as_stage", wrap("h = x |> relu\nout = x |> h |> flatten |> dense(1)")),
        ("loss_as_layer", wrap("out = x |> flatten |> mse")),
        // --- arguments ---
        ("missing_argument", wrap("out = x |> conv2d(8) |> flatten |> dense(1)")),
        ("too_many_arguments", wrap("out = x |> maxpool(2, 2, 0, false, 2) |> flatten |> dense(1)")),
        ("unknown_kwarg", wrap("out = x |> conv2d(8, 3, strides: 2) |> flatten |> dense(1)")),
        ("wrong_arg_type", wrap("out = x |> conv2d(8.5, 3) |> flatten |> dense(1)")),
        ("zero_filters", wrap("out = x |> conv2d(0, 3) |> flatten |> dense(1)")),
        ("negative_units", wrap("out = x |> flatten |> dense(-4)")),
        ("bad_padding", wrap("out = x |> conv2d(8, 3, padding: sme) |> flatten |> dense(1)")),
        ("bad_activation", wrap("out = x |> flatten |> dense(1, activation: selu)")),
        ("unknown_initialiser", wrap("out = x |> flatten |> dense(1, init: he_normall)")),
        ("initialiser_without_argument", wrap("out = x |> conv2d(8, 3, init: normal) |> flatten |> dense(1)")),
        ("initialiser_argument_out_of_range", wrap("out = x |> flatten |> dense(1, bias_init: uniform(limit: -0.1))")),
        ("initialiser_not_a_name", wrap("out = x |> flatten |> dense(1, init: 3)")),
        ("reshape_count_mismatch", wrap("out = x |> reshape([16, 15]) |> flatten |> dense(1)")),
        ("reshape_not_a_multiple", wrap("out = x |> reshape([-1, 3]) |> flatten |> dense(1)")),
        ("reshape_two_inferred", wrap("out = x |> reshape([-1, 4, -1]) |> flatten |> dense(1)")),
        ("reshape_zero_dimension", wrap("out = x |> reshape([0, 16]) |> flatten |> dense(1)")),
        ("reshape_without_shape", wrap("out = x |> reshape |> dense(1)")),
        ("reshape_unclosed_list", wrap("out = x |> reshape([4, 64) |> dense(1)")),
        ("dropout_out_of_range", wrap("out = x |> flatten |> dropout(1.0) |> dense(1)")),
        ("no_input_for_layer", wrap("out = dense(1)")),
        ("zero_dimension", "input x: [16, 0, 1]\n".to_string()),
        ("repeat_zero", wrap("out = x |> repeat 0 { relu } |> flatten |> dense(1)")),
        // --- shapes ---
        ("add_shape_mismatch", wrap("a = x |> conv2d(8, 3)\nb = x |> conv2d(16, 3)\nout = a + b |> flatten |> dense(1)")),
        ("dense_unflattened", wrap("out = x |> conv2d(8, 3) |> dense(1)")),
        ("pool_larger_than_input", wrap("out = x |> maxpool(4) |> maxpool(4) |> maxpool(2) |> flatten |> dense(1)")),
        ("maxpool_window_over_256_positions", "input x: [40, 40, 1]\ntarget y: [1]\nout = x |> maxpool(17) |> flatten |> dense(1)\nloss mse(out, y)\ntrain { batch: 1, optimizer: sgd(lr: 0.01) }\n".to_string()),
        ("kernel_larger_than_input_valid", wrap("out = x |> conv2d(8, 32, padding: valid) |> flatten |> dense(1)")),
        ("conv_on_flat", wrap("out = x |> flatten |> conv2d(8, 3) |> dense(1)")),
        ("mse_shape_mismatch", wrap("out = x |> flatten |> dense(2)")),
        ("residual_channels_mismatch", wrap("block res(x, c) {\n  y = x |> conv2d(c, 3)\n  return relu(x + y)\n}\nout = x |> res(8) |> flatten |> dense(1)")),
        // --- sequences ---
        ("embedding_of_floats", "input x: [16]\ntarget y: int[16]\nout = x |> embedding(64, 8) |> dense(64)\nloss cross_entropy(out, y)\ntrain { batch: 1, optimizer: sgd(lr: 0.01) }\n".to_string()),
        ("tokens_into_dense", "input tokens: int[16]\ntarget y: int[16]\nout = tokens |> dense(64)\nloss cross_entropy(out, y)\ntrain { batch: 1, optimizer: sgd(lr: 0.01) }\n".to_string()),
        ("tokens_without_a_length", "input tokens: int\ntarget y: int\nout = tokens |> embedding(64, 8) |> dense(64)\nloss cross_entropy(out, y)\ntrain { batch: 1, optimizer: sgd(lr: 0.01) }\n".to_string()),
        ("attention_heads_not_dividing", "input tokens: int[16]\ntarget y: int[16]\nout = tokens |> embedding(64, 12) |> attention(5) |> dense(64)\nloss cross_entropy(out, y)\ntrain { batch: 1, optimizer: sgd(lr: 0.01) }\n".to_string()),
        ("tie_to_a_non_embedding", "input tokens: int[16]\ntarget y: int[16]\ne = tokens |> embedding(64, 8)\nh = e |> layernorm\nout = h |> dense(64, tie: h)\nloss cross_entropy(out, y)\ntrain { batch: 1, optimizer: sgd(lr: 0.01) }\n".to_string()),
        ("tie_of_another_shape", "input tokens: int[16]\ntarget y: int[16]\ne = tokens |> embedding(64, 8)\nout = e |> dense(32) |> dense(64, tie: e)\nloss cross_entropy(out, y)\ntrain { batch: 1, optimizer: sgd(lr: 0.01) }\n".to_string()),
        ("attention_on_an_image", wrap("out = x |> attention(2) |> flatten |> dense(1)")),
        ("per_position_labels_of_another_length", "input tokens: int[16]\ntarget y: int[8]\nout = tokens |> embedding(64, 8) |> dense(64)\nloss cross_entropy(out, y)\ntrain { batch: 1, optimizer: sgd(lr: 0.01) }\n".to_string()),
        // --- loss and train ---
        ("missing_loss", format!("{HEAD}out = x |> flatten |> dense(1)\ntrain {{ batch: 1, optimizer: sgd(lr: 0.01) }}\n")),
        ("missing_train", format!("{HEAD}out = x |> flatten |> dense(1)\nloss mse(out, y)\n")),
        ("unknown_loss", format!("{HEAD}out = x |> flatten |> dense(1)\nloss hinge(out, y)\ntrain {{ batch: 1, optimizer: sgd }}\n")),
        ("cross_entropy_float_labels", format!("{HEAD}out = x |> flatten |> dense(10)\nloss cross_entropy(out, y)\ntrain {{ batch: 1, optimizer: sgd }}\n")),
        ("cross_entropy_unflat_logits", "input x: [8, 8, 1]\ntarget label: int\nout = x |> conv2d(10, 3)\nloss cross_entropy(out, label)\ntrain { batch: 1, optimizer: sgd }\n".to_string()),
        ("mse_int_target", "input x: [8]\ntarget label: int\nout = x |> dense(1)\nloss mse(out, label)\ntrain { batch: 1, optimizer: sgd }\n".to_string()),
        ("batch_zero", format!("{HEAD}out = x |> flatten |> dense(1)\nloss mse(out, y)\ntrain {{ batch: 0, optimizer: sgd }}\n")),
        ("missing_batch", format!("{HEAD}out = x |> flatten |> dense(1)\nloss mse(out, y)\ntrain {{ optimizer: sgd }}\n")),
        ("duplicate_train_field", format!("{HEAD}out = x |> flatten |> dense(1)\nloss mse(out, y)\ntrain {{ batch: 1, batch: 2, optimizer: sgd }}\n")),
        ("unknown_train_field", format!("{HEAD}out = x |> flatten |> dense(1)\nloss mse(out, y)\ntrain {{ batch: 1, optimiser: sgd }}\n")),
        ("unknown_optimizer", format!("{HEAD}out = x |> flatten |> dense(1)\nloss mse(out, y)\ntrain {{ batch: 1, optimizer: adagrad(lr: 0.01) }}\n")),
        ("bad_optimizer_kwarg", format!("{HEAD}out = x |> flatten |> dense(1)\nloss mse(out, y)\ntrain {{ batch: 1, optimizer: adam(learning_rate: 0.01) }}\n")),
        ("nesterov_without_momentum", format!("{HEAD}out = x |> flatten |> dense(1)\nloss mse(out, y)\ntrain {{ batch: 1, optimizer: sgd(lr: 0.1, nesterov: true) }}\n")),
        ("negative_lr", format!("{HEAD}out = x |> flatten |> dense(1)\nloss mse(out, y)\ntrain {{ batch: 1, optimizer: sgd(lr: -0.1) }}\n")),
        ("two_losses", format!("{HEAD}out = x |> flatten |> dense(1)\nloss mse(out, y)\nloss mse(out, y)\ntrain {{ batch: 1, optimizer: sgd }}\n")),
        ("huge_kernel", wrap("out = x |> conv2d(2000000000, 2000000000) |> flatten |> dense(1)")),
        ("keras_spelling", wrap("out = x |> Conv2D(8, 3) |> flatten |> dense(1)")),
        ("tuple_kernel", wrap("out = x |> conv2d(8, (3, 3, 3)) |> flatten |> dense(1)")),
        ("transposed_same_with_output_padding", wrap("out = x |> conv_transpose2d(4, 3, stride: 2, padding: same, output_padding: 1) |> flatten |> dense(1)")),
        ("pool_size_of_three_numbers", wrap("out = x |> maxpool((2, 2, 2)) |> flatten |> dense(1)")),
        ("pool_ceil_mode_not_a_flag", wrap("out = x |> maxpool(2, ceil_mode: 1) |> flatten |> dense(1)")),
        ("pool_side_padding_over_half_the_window", wrap("out = x |> avgpool((2, 4), padding: (1, 1, 3, 0)) |> flatten |> dense(1)")),
        ("pool_padding_over_half_the_window", wrap("out = x |> maxpool(2, padding: 2) |> flatten |> dense(1)")),
        ("conv_groups_do_not_divide", wrap("out = x |> conv2d(8, 3) |> conv2d(6, 3, groups: 4) |> flatten |> dense(1)")),
        ("padding_three_numbers", wrap("out = x |> conv2d(8, 3, padding: (1, 1, 1)) |> flatten |> dense(1)")),
        ("negative_padding", wrap("out = x |> conv2d(8, 3, padding: (0, -1)) |> flatten |> dense(1)")),
        ("dilated_kernel_larger_than_input", wrap("out = x |> conv2d(8, 3, dilation: (9, 1), padding: 1) |> flatten |> dense(1)")),
        ("conv_transpose_output_padding_not_below_stride", wrap("out = x |> conv_transpose2d(4, 3, stride: 2, output_padding: 2) |> flatten |> dense(1)")),
        ("conv_transpose_padding_leaves_no_output", wrap("out = x |> conv_transpose2d(4, 1, padding: 9) |> flatten |> dense(1)")),
        ("conv_transpose_output_padding_four_numbers", wrap("out = x |> conv_transpose2d(4, 3, stride: 2, output_padding: (1, 0, 0, 0)) |> flatten |> dense(1)")),
        ("no_parameters", wrap("out = x |> global_avgpool")),
        ("target_fed_to_layer", wrap("out = y |> dense(1)\nunused = x |> relu")),
        // --- order, long lines, byte-order mark ---
        ("loss_before_definition", format!("{HEAD}loss mse(out, y)\nout = x |> flatten |> dense(1)\ntrain {{ batch: 1, optimizer: sgd(lr: 0.01) }}\n")),
        ("error_far_right", wrap(&format!("out = x |>{}conv2(8, 3) |> flatten |> dense(1)", " ".repeat(300)))),
        ("byte_order_mark", "\u{feff}input x [16, 16, 1]\n".to_string()),
        // --- several errors in one file ---
        ("three_mistakes", format!("{HEAD}a = x |> conv2d(8, 3, padding: sme)\nb = x |> conv2(8, 3)\nout = a + b |> flatten |> dense(1)\nloss hinge(out, y)\ntrain {{ batch: 1, optimizer: adma }}\n")),
        // --- activations with a parameter, loss options, optimizers ---
        ("activation_parameter_out_of_range", wrap("out = x |> flatten |> dense(4, activation: leaky_relu(-0.1)) |> dense(1)")),
        ("activation_takes_no_parameter", wrap("out = x |> flatten |> dense(4, activation: relu(0.5)) |> dense(1)")),
        ("elu_alpha_not_positive", wrap("out = x |> elu(alpha: 0) |> flatten |> dense(1)")),
        ("huber_delta_not_positive", format!("{HEAD}out = x |> flatten |> dense(1)\nloss huber(out, y, delta: 0)\ntrain {{ batch: 1, optimizer: sgd }}\n")),
        ("loss_option_of_another_loss", format!("{HEAD}out = x |> flatten |> dense(1)\nloss mse(out, y, delta: 1.0)\ntrain {{ batch: 1, optimizer: sgd }}\n")),
        ("label_smoothing_out_of_range", "input x: [4]\ntarget y: int\nout = x |> dense(3)\nloss cross_entropy(out, y, label_smoothing: 1.5)\ntrain { batch: 1, optimizer: sgd }\n".to_string()),
        ("bce_with_integer_labels", "input x: [4]\ntarget y: int\nout = x |> dense(1)\nloss bce_with_logits(out, y)\ntrain { batch: 1, optimizer: sgd }\n".to_string()),
        ("rmsprop_centered", format!("{HEAD}out = x |> flatten |> dense(1)\nloss mse(out, y)\ntrain {{ batch: 1, optimizer: rmsprop(lr: 0.01, centered: true) }}\n")),
        // --- learning-rate schedules ---
        ("unknown_schedule", format!("{HEAD}out = x |> flatten |> dense(1)\nloss mse(out, y)\ntrain {{ batch: 1, optimizer: adam, schedule: cosin(warmup: 10) }}\n")),
        ("schedule_steps_within_warmup", format!("{HEAD}out = x |> flatten |> dense(1)\nloss mse(out, y)\ntrain {{ batch: 1, optimizer: adam, schedule: cosine(warmup: 100, steps: 100) }}\n")),
        ("schedule_min_lr_above_lr", format!("{HEAD}out = x |> flatten |> dense(1)\nloss mse(out, y)\ntrain {{ batch: 1, optimizer: sgd(lr: 0.01), schedule: linear(min_lr: 0.1) }}\n")),
        ("step_schedule_gamma_out_of_range", format!("{HEAD}out = x |> flatten |> dense(1)\nloss mse(out, y)\ntrain {{ batch: 1, optimizer: sgd, schedule: step(every: 100, gamma: 2) }}\n")),
        ("step_schedule_without_every", format!("{HEAD}out = x |> flatten |> dense(1)\nloss mse(out, y)\ntrain {{ batch: 1, optimizer: sgd, schedule: step(gamma: 0.5) }}\n")),
        // --- gradient clipping and accumulation ---
        ("clip_value_not_positive", format!("{HEAD}out = x |> flatten |> dense(1)\nloss mse(out, y)\ntrain {{ batch: 1, optimizer: sgd, clip_value: 0 }}\n")),
        ("clip_value_not_a_number", format!("{HEAD}out = x |> flatten |> dense(1)\nloss mse(out, y)\ntrain {{ batch: 1, optimizer: sgd, clip_value: (1, 2) }}\n")),
        ("clip_value_beyond_f32", format!("{HEAD}out = x |> flatten |> dense(1)\nloss mse(out, y)\ntrain {{ batch: 1, optimizer: sgd, clip_value: 1e39 }}\n")),
        ("clip_norm_negative", format!("{HEAD}out = x |> flatten |> dense(1)\nloss mse(out, y)\ntrain {{ batch: 1, optimizer: sgd, clip_norm: -1.0 }}\n")),
        ("accumulate_zero", format!("{HEAD}out = x |> flatten |> dense(1)\nloss mse(out, y)\ntrain {{ batch: 1, optimizer: sgd, accumulate: 0 }}\n")),
        ("accumulate_not_whole", format!("{HEAD}out = x |> flatten |> dense(1)\nloss mse(out, y)\ntrain {{ batch: 1, optimizer: sgd, accumulate: 2.5 }}\n")),
        ("batchnorm_momentum_out_of_range", wrap("out = x |> batchnorm(momentum: 1.5) |> flatten |> dense(1)")),
        ("batchnorm_eps_not_positive", wrap("out = x |> batchnorm(eps: 0) |> flatten |> dense(1)")),
        ("batchnorm_of_a_matrix", "input x: [4, 3]\ntarget y: [1]\nout = x |> batchnorm |> flatten |> dense(1)\nloss mse(out, y)\ntrain { batch: 1, optimizer: sgd }\n".to_string()),
        ("layernorm_eps_not_positive", wrap("out = x |> layernorm(eps: -1e-5) |> flatten |> dense(1)")),
        ("layernorm_unknown_argument", wrap("out = x |> layernorm(momentum: 0.1) |> flatten |> dense(1)")),
        ("multiply_shape_mismatch", wrap("a = x |> conv2d(4, 3)\nout = (x * a) |> flatten |> dense(1)")),
        ("concat_axis_differs", wrap("p = x |> maxpool(2)\nout = concat(x, p) |> flatten |> dense(1)")),
        ("concat_one_value", wrap("out = concat(x) |> flatten |> dense(1)")),
        // --- a weighted sum of losses ---
        ("loss_weight_zero", format!("{HEAD}out = x |> flatten |> dense(1)\nloss 0 * mse(out, y) + mae(out, y)\ntrain {{ batch: 1, optimizer: sgd }}\n")),
        ("loss_weight_negative", format!("{HEAD}out = x |> flatten |> dense(1)\nloss mse(out, y) + -0.5 * mae(out, y)\ntrain {{ batch: 1, optimizer: sgd }}\n")),
        ("loss_weight_beyond_f32", format!("{HEAD}out = x |> flatten |> dense(1)\nloss 1e39 * mse(out, y)\ntrain {{ batch: 1, optimizer: sgd }}\n")),
        ("loss_weight_a_name", format!("{HEAD}w = 2\nout = x |> flatten |> dense(1)\nloss w * mse(out, y)\ntrain {{ batch: 1, optimizer: sgd }}\n")),
        ("loss_weight_without_star", format!("{HEAD}out = x |> flatten |> dense(1)\nloss 0.5 mse(out, y)\ntrain {{ batch: 1, optimizer: sgd }}\n")),
        ("loss_trailing_plus", format!("{HEAD}out = x |> flatten |> dense(1)\nloss mse(out, y) +\ntrain {{ batch: 1, optimizer: sgd }}\n")),
        ("loss_terms_share_a_target_of_another_kind", "input x: [4]\ntarget label: int\nlogits = x |> dense(3)\nloss cross_entropy(logits, label) + 0.1 * mse(logits, label)\ntrain { batch: 1, optimizer: sgd }\n".to_string()),
        ("loss_two_terms_in_error", "input x: [4]\ntarget y: [2]\nout = x |> dense(3)\nloss 0.5 * mse(out, y) + huber(out, y, delta: -1)\ntrain { batch: 1, optimizer: sgd }\n".to_string()),
        ("loss_head_unused", "input x: [4]\ntarget y: [1]\nh = x |> dense(8)\nout = h |> dense(1)\nother = h |> dense(2)\nloss mse(out, y)\ntrain { batch: 1, optimizer: sgd }\n".to_string()),
        ("block_error_in_every_use", wrap("block b(x, c) {\n  h = x |> conv2d(c, 3, activation: selu)\n  return x + h\n}\nout = x |> b(1) |> b(1) |> flatten |> dense(1)")),
    ]
}

#[test]
fn catalogue() {
    let cases = cases();
    assert!(cases.len() >= 30);
    let mut names = std::collections::HashSet::new();
    for (name, src) in cases {
        assert!(names.insert(name), "duplicate case {name}");
        let diag = match compile_source(&src, "bad.dm") {
            Ok(_) => panic!("case {name} compiled but should fail:\n{src}"),
            Err(d) => d,
        };
        assert!(
            diag.span.start <= diag.span.end && diag.span.end <= src.len(),
            "{name}: span out of range"
        );
        let text = render_plain(&diag);
        for d in diag.all() {
            assert!(
                d.span.start <= d.span.end && d.span.end <= src.len(),
                "{name}: span out of range"
            );
            assert!(
                text.contains(&format!("bad.dm:{}:{}", d.line, d.col)),
                "{name}: no file:line:col in\n{text}"
            );
        }
        // The activation choices are `UnaryKind::ALL` (checked here), so that a new activation
        // does not change the snapshot.
        let all = "<every activation of UnaryKind::ALL>";
        let names: Vec<String> = dmc_plan::unary::UnaryKind::ALL
            .iter()
            .map(|k| format!("`{}`", k.name()))
            .collect();
        let list = format!("expected one of `none`, {}", names.join(", "));
        if name == "bad_activation" {
            assert!(text.contains(&list), "{name}: {text}");
        }
        let text = text.replace(&list, &format!("expected one of `none`, {all}"));
        let acts: Vec<&str> = dmc_plan::unary::UnaryKind::ALL
            .iter()
            .map(|k| k.name())
            .collect();
        let text = text.replace(
            &format!("(supported activations: {})", acts.join(", ")),
            &format!("(supported activations: {all})"),
        );
        insta::assert_snapshot!(name, format!("{src}\n----\n{text}"));
    }
}
