//! The progress bar of a command that trains (drawn on a terminal only).

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::app::train::Trainer;

use super::CliResult;

/// A bar of `total` steps at step `at`, hidden unless standard error is a
/// terminal.
pub fn progress_bar(total: u64, at: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    if !std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template("{bar:30} step {pos}/{len}  {msg}  [{elapsed_precise}]")
            .expect("valid template"),
    );
    bar.set_position(at);
    bar
}

/// Runs a trainer to its last step behind a progress bar whose message
/// starts with `what`.
pub fn run_to_end(trainer: &mut Trainer<f32>, what: &str) -> CliResult<()> {
    let bar = progress_bar(trainer.config().steps, trainer.step_index());
    while !trainer.is_done() {
        let s = trainer.step()?;
        bar.set_position(trainer.step_index());
        bar.set_message(format!("{what}, loss {:.4}", s.total));
    }
    bar.finish_and_clear();
    Ok(())
}
