//! Table-driven tests: one driver runs every row of a table, each row
//! caught apart, and the test fails naming every row that failed with its
//! own message. A row's expected message is a [`Want`].

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A message a row expects, where `{dir}` stands for the row's folder.
#[derive(Clone, Copy, Debug)]
pub enum Want {
    /// The whole message.
    Is(&'static str),
    /// How the message begins.
    StartsWith(&'static str),
    /// How the message ends.
    EndsWith(&'static str),
    /// Pieces the message holds, each somewhere.
    Contains(&'static [&'static str]),
}

impl Want {
    /// Asserts `message` is what this asks for, `{dir}` read as `dir`.
    #[track_caller]
    pub fn check(&self, message: &str, dir: &str) {
        let dir_in = |want: &str| want.replace("{dir}", dir);
        match *self {
            Want::Is(want) => assert_eq!(message, dir_in(want)),
            Want::StartsWith(want) => {
                assert!(message.starts_with(&dir_in(want)), "{message}")
            }
            Want::EndsWith(want) => assert!(message.ends_with(&dir_in(want)), "{message}"),
            Want::Contains(pieces) => {
                for piece in pieces {
                    assert!(
                        message.contains(&dir_in(piece)),
                        "no {piece:?} in: {message}"
                    );
                }
            }
        }
    }
}

/// What a panic said.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// Runs `check` on every row (on as many threads as there are cores),
/// then fails if any row failed, naming each failed row (`name`) with its
/// panic message, in the table's order. Row names must be unique.
pub fn run_rows<R: Sync>(rows: &[R], name: impl Fn(&R) -> &str + Sync, check: impl Fn(&R) + Sync) {
    assert!(!rows.is_empty(), "an empty table");
    let mut names: Vec<&str> = rows.iter().map(&name).collect();
    names.sort_unstable();
    for pair in names.windows(2) {
        assert_ne!(pair[0], pair[1], "two rows of one name");
    }
    let failed: Mutex<Vec<Option<String>>> = Mutex::new(vec![None; rows.len()]);
    let next = AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..threads.min(rows.len()) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(row) = rows.get(i) else { break };
                    if let Err(panic) = catch_unwind(AssertUnwindSafe(|| check(row))) {
                        failed.lock().unwrap()[i] = Some(panic_message(&*panic));
                    }
                }
            });
        }
    });
    let failed: Vec<String> = failed
        .into_inner()
        .unwrap()
        .into_iter()
        .zip(rows)
        .filter_map(|(m, row)| m.map(|m| format!("row {}: {m}", name(row))))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} rows failed:\n{}",
        failed.len(),
        rows.len(),
        failed.join("\n")
    );
}
