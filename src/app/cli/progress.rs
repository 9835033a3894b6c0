//! The progress of a command that trains: a bar on a terminal; when
//! standard error is not one (a file, a pipe, a job scheduler's log), a
//! plain line after the first step, then every few seconds, then at the
//! end; nothing with `--quiet`.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::app::train::Trainer;

use super::CliResult;

/// Seconds between two plain progress lines.
const LINE_EVERY: Duration = Duration::from_secs(5);

/// Where the progress goes.
enum Sink {
    Bar(ProgressBar),
    Lines {
        last: Option<Instant>,
        start: Instant,
        from: u64,
    },
    Quiet,
}

/// The progress of `total` steps.
pub struct Progress {
    sink: Sink,
    total: u64,
    at: u64,
    message: String,
}

impl Progress {
    /// The progress of `total` steps at step `at`: a bar when standard
    /// error is a terminal, plain lines otherwise, nothing if `quiet`.
    pub fn new(total: u64, at: u64, quiet: bool) -> Self {
        let sink = if quiet {
            Sink::Quiet
        } else if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(total);
            bar.set_style(
                ProgressStyle::with_template(
                    "{bar:30} step {pos}/{len}  {msg}  [{elapsed_precise}]",
                )
                .expect("valid template"),
            );
            bar.set_position(at);
            Sink::Bar(bar)
        } else {
            Sink::Lines {
                last: None,
                start: Instant::now(),
                from: at,
            }
        };
        Self {
            sink,
            total,
            at,
            message: String::new(),
        }
    }

    /// Now at step `at`, with `message` (the loss, the speed).
    pub fn update(&mut self, at: u64, message: String) {
        self.at = at;
        match &mut self.sink {
            Sink::Bar(bar) => {
                bar.set_position(at);
                bar.set_message(message);
            }
            Sink::Lines { last, .. } => {
                let due = last.is_none_or(|t| t.elapsed() >= LINE_EVERY);
                self.message = message;
                if due {
                    self.line();
                }
            }
            Sink::Quiet => {}
        }
    }

    /// Ends the progress: clears the bar, or writes the last line.
    pub fn finish(mut self) {
        match &self.sink {
            Sink::Bar(bar) => bar.finish_and_clear(),
            Sink::Lines { last, .. } => {
                if last.is_some() {
                    self.line();
                }
            }
            Sink::Quiet => {}
        }
    }

    /// Writes one plain line: the step, the message, the time gone and the
    /// time left at this run's pace.
    fn line(&mut self) {
        let Sink::Lines { last, start, from } = &mut self.sink else {
            return;
        };
        let elapsed = start.elapsed();
        let done = self.at.saturating_sub(*from);
        let left = self.total.saturating_sub(self.at);
        let eta = if done > 0 {
            clock(elapsed.mul_f64(left as f64 / done as f64))
        } else {
            "?".to_string()
        };
        let pct = if self.total > 0 {
            100.0 * self.at as f64 / self.total as f64
        } else {
            100.0
        };
        // A failed write to standard error has nowhere to be reported.
        let _ = writeln!(
            std::io::stderr(),
            "splitgrad: step {}/{} ({pct:.0}%)  {}  elapsed {}  left {eta}",
            self.at,
            self.total,
            self.message,
            clock(elapsed),
        );
        *last = Some(Instant::now());
    }
}

/// `h:mm:ss` (or `m:ss` under an hour).
fn clock(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

/// Runs a trainer to its last step, showing its progress (nothing if
/// `quiet`), with a message that starts with `what`.
pub fn run_to_end(trainer: &mut Trainer<f32>, what: &str, quiet: bool) -> CliResult<()> {
    let mut progress = Progress::new(trainer.config().steps, trainer.step_index(), quiet);
    while !trainer.is_done() {
        let s = trainer.step()?;
        progress.update(trainer.step_index(), format!("{what}, loss {:.4}", s.total));
    }
    progress.finish();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_reads_as_minutes_then_hours() {
        assert_eq!(clock(Duration::from_secs(0)), "0:00");
        assert_eq!(clock(Duration::from_secs(65)), "1:05");
        assert_eq!(clock(Duration::from_secs(3 * 3600 + 62)), "3:01:02");
    }
}
