//! Running the program under test, comparing its answers, and the search
//! for a minimal differing case.

use super::*;

// ---------------------------------------------------------------------------
// A case ready to run: its bytes and splitgrad's results.

pub(super) struct Prepared {
    pub(super) case: FuzzCase,
    /// What made it from the case before (empty for a generated case).
    change: String,
    /// The inputs, as an npz.
    bytes: Vec<u8>,
    /// splitgrad's results, in the order they are written.
    reference: Vec<(String, ArrayD<f64>)>,
}

pub(super) fn results_f64(results: &Results) -> Vec<(String, ArrayD<f64>)> {
    match results {
        Results::F32(named) | Results::Half { named, .. } => named
            .iter()
            .map(|(n, a)| (n.clone(), a.mapv(f64::from)))
            .collect(),
        Results::F64(named) => named.clone(),
    }
}

impl Prepared {
    /// The case with its reference results; an error when splitgrad
    /// rejects it (a derived case that is not valid).
    pub(super) fn new(case: FuzzCase, change: String) -> Result<Self> {
        let bytes = to_bytes(&case.writer()?)?;
        let results = compute(case.layer(), Path::new("case"), bytes.clone())?;
        Ok(Prepared {
            reference: results_f64(&results),
            case,
            change,
            bytes,
        })
    }

    /// The golden case file: the inputs, then splitgrad's results.
    pub(super) fn golden_bytes(&self) -> Result<Vec<u8>> {
        let mut w = self.case.writer()?;
        compute(self.case.layer(), Path::new("case"), self.bytes.clone())?.add_to(&mut w);
        to_bytes(&w)
    }

    /// How the answer at `path` differs from the reference.
    pub(super) fn compare(&self, path: &Path) -> Vec<Difference> {
        if std::fs::symlink_metadata(path).is_err() {
            return vec![Difference::NoAnswer];
        }
        let unreadable = |e: Error| {
            let msg = e.to_string();
            let prefix = format!("{}: ", path.display());
            Difference::Unreadable(msg.strip_prefix(&prefix).unwrap_or(&msg).to_string())
        };
        let mut r = match NpzReader::open(path) {
            Ok(r) => r,
            Err(e) => return vec![unreadable(e)],
        };
        let layer = self.case.layer();
        let rtol = self.case.rtol();
        let mut out = Vec::new();
        for (name, b) in &self.reference {
            if !r.contains(name) {
                out.push(Difference::Missing(name.clone()));
                continue;
            }
            let found = match r.shape(name) {
                Ok(s) => s,
                Err(e) => {
                    out.push(unreadable(e));
                    continue;
                }
            };
            if found != b.shape() {
                out.push(Difference::Shape {
                    array: name.clone(),
                    found,
                    expected: b.shape().to_vec(),
                });
                continue;
            }
            let expected = self.case.dtype.of_result(layer, name);
            match r.dtype(name).and_then(|d| CaseDtype::of(&d)) {
                Ok(d) if d == expected => {}
                _ => {
                    let found = r
                        .dtype(name)
                        .map(|d| d.to_string())
                        .unwrap_or_else(|e| e.to_string());
                    out.push(Difference::Dtype {
                        array: name.clone(),
                        found,
                        expected: numpy_name(expected),
                    });
                    continue;
                }
            }
            let a = match CaseDtype::read_any(&mut r, name) {
                Ok(a) => a,
                Err(e) => {
                    out.push(unreadable(e));
                    continue;
                }
            };
            if let Some(d) = worst(name, &a, b, &self.case.exact(name), rtol) {
                out.push(d);
            }
        }
        out
    }
}

/// The worst element of `a` against `b`, if any is not close.
pub(super) fn worst(
    name: &str,
    a: &ArrayD<f64>,
    b: &ArrayD<f64>,
    exact: &Exact,
    rtol: f64,
) -> Option<Difference> {
    let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let tol = rtol * (1.0 + scale);
    // (excess over the tolerance, element), the largest; NaN is infinite.
    let mut worst: Option<(f64, usize, f64)> = None;
    for (i, (&x, &y)) in a.iter().zip(b.iter()).enumerate() {
        let exact = exact.at(i);
        let bad = if exact {
            x != y
        } else {
            (x - y).is_nan() || (x - y).abs() > tol
        };
        if bad {
            let t = if exact { 0.0 } else { tol };
            let err = (x - y).abs();
            let excess = if err.is_nan() { f64::INFINITY } else { err - t };
            if worst.is_none_or(|(e, _, _)| excess > e) {
                worst = Some((excess, i, t));
            }
        }
    }
    let (_, i, tolerance) = worst?;
    let (found, expected) = (a.iter().nth(i)?, b.iter().nth(i)?);
    Some(Difference::Values {
        array: name.to_string(),
        index: unravel(i, b.shape()),
        found: *found,
        expected: *expected,
        tolerance,
    })
}

pub(super) use crate::kernels::unravel;

// ---------------------------------------------------------------------------
// Running the program.

/// How a run of the program ended.
pub(super) enum RunEnd {
    Finished,
    Failed(String),
}

#[cfg(unix)]
unsafe extern "C" {
    // POSIX `int kill(pid_t pid, int sig)`; pid_t is i32 on every Unix
    // Rust supports.
    pub(super) fn kill(pid: i32, sig: i32) -> i32;
}

/// Kills the child and its process group (it was started as the leader of
/// its own group), and reaps it.
pub(super) fn stop(child: &mut Child) {
    #[cfg(unix)]
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: `kill(-pgid, SIGKILL = 9)` takes plain integers and has no
        // memory effects. The group is the child's own (`process_group(0)`);
        // the child is not reaped yet, so its id cannot have been reused.
        unsafe {
            kill(-pid, 9);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

pub(super) fn shell(command: &str, inputs: &Path, outputs: &Path) -> Command {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(format!("{command} \"$@\""))
            .arg("sh")
            .arg(inputs)
            .arg(outputs)
            .process_group(0);
        c
    }
    #[cfg(not(unix))]
    {
        let mut c = Command::new("cmd");
        c.arg("/C").arg(format!(
            "{command} \"{}\" \"{}\"",
            inputs.display(),
            outputs.display()
        ));
        c
    }
}

pub(super) fn describe_status(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exited with status {code}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return format!("was killed by signal {signal}");
        }
    }
    format!("ended with {status}")
}

/// The last non-empty line of the log, shortened.
pub(super) fn last_line(log: &Path) -> Option<String> {
    const TAIL: u64 = 4096;
    let mut f = File::open(log).ok()?;
    let len = f.metadata().ok()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(TAIL))).ok()?;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let full = text.lines().rev().map(str::trim).find(|l| !l.is_empty())?;
    let mut line: String = full.chars().take(160).collect();
    if full.chars().count() > 160 {
        line.push('…');
    }
    Some(line)
}

pub(super) struct Runner<'a> {
    config: &'a FuzzConfig,
    runs: usize,
    scratch: PathBuf,
}

/// A case that differs: its place in the list, how, and the program's
/// answer file (when it wrote one that can be kept).
pub(super) type Found = (usize, Vec<Difference>, Option<Vec<u8>>);

/// The result of running the program on several cases.
pub(super) enum Batch {
    /// Each case's differences (empty when it agrees).
    Judged(Vec<Vec<Difference>>),
    /// The run failed as a whole.
    Failed(String),
}

pub(super) fn interrupted() -> Error {
    Error::config("interrupted: the program under test was stopped")
}

impl Runner<'_> {
    pub(super) fn stopped(&self) -> bool {
        self.config
            .stop
            .as_ref()
            .is_some_and(|s| s.load(Ordering::Relaxed))
    }

    /// Runs the program on `inputs` (holding `<layer>/…`), answers to
    /// `outputs`, its output to `log`.
    pub(super) fn run(&mut self, inputs: &Path, outputs: &Path, log: &Path) -> Result<RunEnd> {
        let layer = self.config.layer.name();
        let answers = outputs.join(layer);
        std::fs::create_dir_all(&answers).map_err(|e| Error::from(e).in_file(&answers))?;
        let out = File::create(log).map_err(|e| Error::from(e).in_file(log))?;
        let err = out.try_clone().map_err(|e| Error::from(e).in_file(log))?;
        if self.stopped() {
            return Err(interrupted());
        }
        self.runs += 1;
        let mut command = shell(&self.config.command, inputs, outputs);
        command
            .env("SPLITGRAD_FUZZ_INPUTS", inputs)
            .env("SPLITGRAD_FUZZ_OUTPUTS", outputs)
            .env("SPLITGRAD_FUZZ_LAYER", layer)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let mut child = match command.spawn() {
            Ok(c) => c,
            Err(e) => return Ok(RunEnd::Failed(format!("could not be started: {e}"))),
        };
        let start = Instant::now();
        let mut pause = Duration::from_millis(1);
        let with_log = |what: String| match last_line(log) {
            Some(line) => format!("{what} (its last output: {line})"),
            None => what,
        };
        loop {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(RunEnd::Finished),
                Ok(Some(status)) => return Ok(RunEnd::Failed(with_log(describe_status(status)))),
                Ok(None) => {}
                Err(e) => {
                    stop(&mut child);
                    return Ok(RunEnd::Failed(format!("could not be waited for: {e}")));
                }
            }
            if self.stopped() {
                stop(&mut child);
                return Err(interrupted());
            }
            let elapsed = start.elapsed();
            if elapsed >= self.config.timeout {
                stop(&mut child);
                let secs = self.config.timeout.as_secs_f64();
                return Ok(RunEnd::Failed(with_log(format!(
                    "did not finish within the timeout of {} s and was stopped",
                    num(secs)
                ))));
            }
            std::thread::sleep(pause.min(self.config.timeout - elapsed));
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    /// Writes `cases` as `cand-NNNN.npz` into a fresh scratch folder, runs
    /// the program on them and judges each answer; returns the verdicts and
    /// the folder (removed by the caller).
    pub(super) fn batch(&mut self, cases: &[&Prepared]) -> Result<(Batch, PathBuf)> {
        let layer = self.config.layer.name();
        let dir = self.scratch.join(format!("run-{:04}", self.runs + 1));
        let inputs = dir.join("cases");
        let outputs = dir.join("answers");
        let case_dir = inputs.join(layer);
        std::fs::create_dir_all(&case_dir).map_err(|e| Error::from(e).in_file(&case_dir))?;
        for (i, p) in cases.iter().enumerate() {
            // Scratch files, rewritten for every run and removed after it:
            // plain writes (no sync), unlike the results.
            let path = case_dir.join(format!("cand-{i:04}.npz"));
            std::fs::write(&path, &p.bytes).map_err(|e| Error::from(e).in_file(&path))?;
        }
        let end = self.run(&inputs, &outputs, &dir.join("program.log"))?;
        let batch = match end {
            RunEnd::Failed(why) => Batch::Failed(why),
            RunEnd::Finished => Batch::Judged(
                cases
                    .iter()
                    .enumerate()
                    .map(|(i, p)| p.compare(&outputs.join(layer).join(format!("cand-{i:04}.npz"))))
                    .collect(),
            ),
        };
        Ok((batch, dir))
    }

    /// The answer file of case `i` of a batch folder, if it can be kept.
    pub(super) fn answer_of(&self, dir: &Path, i: usize) -> Option<Vec<u8>> {
        let path = dir
            .join("answers")
            .join(self.config.layer.name())
            .join(format!("cand-{i:04}.npz"));
        read_answer(&path)
    }

    /// The first of `list` whose answer differs, each case run alone.
    pub(super) fn first_alone(
        &mut self,
        list: &[Prepared],
        progress: &mut dyn FnMut(Event<'_>),
    ) -> Result<Option<Found>> {
        for (i, p) in list.iter().enumerate() {
            if let Some((_, d, answer)) =
                self.first_difference(std::slice::from_ref(p), progress)?
            {
                return Ok(Some((i, d, answer)));
            }
        }
        Ok(None)
    }

    /// The first of `list` (in order) whose answer differs, with the
    /// differences and the answer's bytes; the runs hold at most [`BATCH`]
    /// cases, and a run that fails as a whole is repeated case by case.
    pub(super) fn first_difference(
        &mut self,
        list: &[Prepared],
        progress: &mut dyn FnMut(Event<'_>),
    ) -> Result<Option<Found>> {
        for (chunk_no, chunk) in list.chunks(BATCH).enumerate() {
            let offset = chunk_no * BATCH;
            let refs: Vec<&Prepared> = chunk.iter().collect();
            let (batch, dir) = self.batch(&refs)?;
            let found = match batch {
                Batch::Judged(verdicts) => verdicts
                    .into_iter()
                    .enumerate()
                    .find(|(_, d)| !d.is_empty())
                    .map(|(i, d)| (i, d, self.answer_of(&dir, i))),
                Batch::Failed(why) if chunk.len() == 1 => {
                    Some((0, vec![Difference::Run(why)], self.answer_of(&dir, 0)))
                }
                Batch::Failed(why) => {
                    remove_scratch(&dir);
                    progress(Event::BatchFailed {
                        cases: chunk.len(),
                        failure: &why,
                    });
                    self.first_alone(chunk, progress)?
                }
            };
            remove_scratch(&dir);
            if let Some((i, d, answer)) = found {
                return Ok(Some((offset + i, d, answer)));
            }
        }
        Ok(None)
    }
}

pub(super) fn remove_scratch(dir: &Path) {
    if dir.is_dir() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

pub(super) fn read_answer(path: &Path) -> Option<Vec<u8>> {
    let meta = crate::io::regular_file(path).ok()?;
    if meta.len() > MAX_KEPT_ANSWER {
        return None;
    }
    std::fs::read(path).ok()
}

/// Checks that `out` is empty or absent, creates it and returns its
/// absolute path.
pub(super) fn prepare_out(out: &Path) -> Result<PathBuf> {
    if out.exists() {
        if !out.is_dir() {
            return Err(Error::config("--out must be a folder; this is a file").in_file(out));
        }
        let mut entries = std::fs::read_dir(out).map_err(|e| Error::from(e).in_file(out))?;
        if entries.next().is_some() {
            return Err(Error::config(
                "the output folder is not empty: fuzz writes only into an empty or new folder, \
                 so that it replaces no earlier results; give another --out",
            )
            .in_file(out));
        }
    }
    std::fs::create_dir_all(out).map_err(|e| Error::from(e).in_file(out))?;
    out.canonicalize().map_err(|e| Error::from(e).in_file(out))
}

pub(super) fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::from(e).in_file(dir))?;
    }
    write_atomic(path, |f| Ok(f.write_all(bytes)?))
}

/// Generates `config.cases` cases of the layer, runs the program on them
/// and compares its answers with splitgrad's; on a difference, shrinks the
/// case to a minimal one and writes it. `docs/golden.md` (*Fuzzing a
/// program*) describes the program's contract, what is a difference, the
/// tolerances, the shrinking and the files written. `progress` is told what
/// happens as it happens.
///
/// Errors: `cases` 0, an empty command or a zero timeout
/// ([`crate::ErrorKind::Config`]); `out` a file or a folder that is not
/// empty ([`crate::ErrorKind::Config`] naming it); a file or folder that
/// cannot be written ([`crate::ErrorKind::Io`] naming it); `config.stop`
/// set ([`crate::ErrorKind::Config`], after the program is stopped). A
/// program that cannot be started is a difference, not an error. The
/// scratch folder is removed in every case.
///
/// ```no_run
/// use std::time::Duration;
/// use splitgrad::app::golden::{CaseDtype, FuzzConfig, FuzzOutcome, Layer, fuzz};
/// let config = FuzzConfig {
///     layer: Layer::LmHead,
///     cases: 64,
///     seed: 0,
///     dtype: CaseDtype::F64,
///     timeout: Duration::from_secs(60),
///     command: "python3 my_head.py".into(),
///     out: "fuzz-head".into(),
///     stop: None,
/// };
/// match fuzz(&config, &mut |_| {})? {
///     FuzzOutcome::Agree { cases } => println!("{cases} cases agree"),
///     FuzzOutcome::Differ(finding) => println!("{}", finding.summary()),
///     FuzzOutcome::BatchOnly { failure, .. } => println!("the program {failure}"),
/// }
/// # Ok::<(), splitgrad::Error>(())
/// ```
pub fn fuzz(config: &FuzzConfig, progress: &mut dyn FnMut(Event<'_>)) -> Result<FuzzOutcome> {
    if config.cases == 0 {
        return Err(Error::config("the number of cases must be at least 1"));
    }
    if config.command.trim().is_empty() {
        return Err(Error::config("the command to run is empty"));
    }
    if config.timeout.is_zero() {
        return Err(Error::config("the timeout must be positive"));
    }
    let out = prepare_out(&config.out)?;
    let result = search(config, &out, progress);
    // Whatever happened, the runs on derived cases are over.
    remove_scratch(&out.join("scratch"));
    result
}

/// [`fuzz`] in the prepared folder `out` (absolute).
pub(super) fn search(
    config: &FuzzConfig,
    out: &Path,
    progress: &mut dyn FnMut(Event<'_>),
) -> Result<FuzzOutcome> {
    let layer = config.layer;

    // The generated cases, inputs only.
    let cases_dir = out.join("cases");
    let base = Rng::new(config.seed);
    let mut generated = Vec::with_capacity(config.cases);
    for i in 0..config.cases {
        let bytes = generate_case(layer, &mut base.fork(i as u64), config.dtype);
        let case = FuzzCase::read(layer, config.dtype, bytes)?;
        let prepared = Prepared::new(case, String::new())?;
        write_file(
            &cases_dir.join(layer.name()).join(case_file_name(i)),
            &prepared.bytes,
        )?;
        generated.push(prepared);
    }
    progress(Event::Generated {
        cases: config.cases,
        dir: &cases_dir,
    });

    let mut runner = Runner {
        config,
        runs: 0,
        scratch: out.join("scratch"),
    };
    let answers_dir = out.join("answers");
    let start = Instant::now();
    let end = runner.run(&cases_dir, &answers_dir, &out.join("program.log"))?;
    let name_of = |i: usize| case_file_name(i).trim_end_matches(".npz").to_string();
    let answer_path = |i: usize| answers_dir.join(layer.name()).join(case_file_name(i));
    let first = match end {
        RunEnd::Finished => {
            let verdicts: Vec<Vec<Difference>> = generated
                .iter()
                .enumerate()
                .map(|(i, p)| p.compare(&answer_path(i)))
                .collect();
            let differing = verdicts.iter().filter(|d| !d.is_empty()).count();
            progress(Event::Checked {
                cases: config.cases,
                differing,
                elapsed: start.elapsed(),
            });
            // The smallest differing case, the first of equal ones.
            verdicts
                .into_iter()
                .enumerate()
                .filter(|(_, d)| !d.is_empty())
                .min_by_key(|(i, _)| (generated[*i].case.size(), *i))
                .map(|(i, d)| (i, d, read_answer(&answer_path(i))))
        }
        RunEnd::Failed(why) if config.cases == 1 => {
            Some((0, vec![Difference::Run(why)], read_answer(&answer_path(0))))
        }
        RunEnd::Failed(why) => {
            progress(Event::BatchFailed {
                cases: config.cases,
                failure: &why,
            });
            match runner.first_alone(&generated, progress)? {
                Some(found) => Some(found),
                None => {
                    return Ok(FuzzOutcome::BatchOnly {
                        cases: config.cases,
                        failure: why,
                    });
                }
            }
        }
    };
    let Some((index, mut differences, mut answer)) = first else {
        return Ok(FuzzOutcome::Agree {
            cases: config.cases,
        });
    };
    let original = name_of(index);
    let mut current = generated.swap_remove(index);
    drop(generated);
    let mut description = current.case.describe();
    progress(Event::Found {
        name: &original,
        case: &description,
        differences: &differences,
    });

    // Greedy shrinking: the first smaller case that still differs replaces
    // the current one, until none does.
    let mut steps = 0;
    loop {
        let mut seen = HashSet::new();
        let candidates: Vec<Prepared> = current
            .case
            .candidates()
            .into_iter()
            .filter_map(|(what, c)| Prepared::new(c, what).ok())
            .filter(|p| p.bytes != current.bytes && seen.insert(p.bytes.clone()))
            .collect();
        if candidates.is_empty() {
            break;
        }
        let Some((i, d, a)) = runner.first_difference(&candidates, progress)? else {
            break;
        };
        steps += 1;
        current = candidates
            .into_iter()
            .nth(i)
            .ok_or_else(|| Error::format("a shrink step lost its case"))?;
        differences = d;
        answer = a;
        description = current.case.describe();
        progress(Event::Shrunk {
            step: steps,
            change: &current.change,
            case: &description,
        });
    }
    remove_scratch(&runner.scratch);
    // Written under the absolute path, named as the caller named `out`.
    let minimal_file = Path::new("minimal").join(layer.name()).join("minimal.npz");
    write_file(&out.join(&minimal_file), &current.golden_bytes()?)?;
    let answer_file = Path::new("minimal-answer")
        .join(layer.name())
        .join("minimal.npz");
    let answer = match answer {
        Some(bytes) => {
            write_file(&out.join(&answer_file), &bytes)?;
            Some(config.out.join(answer_file))
        }
        None => None,
    };
    let minimal_dir = config.out.join("minimal");
    let minimal = config.out.join(minimal_file);
    let finding = Finding {
        layer,
        dtype: config.dtype,
        original,
        case: description,
        differences,
        steps,
        runs: runner.runs,
        minimal_dir,
        minimal,
        answer,
    };
    let mut text = finding.summary();
    text.push('\n');
    for d in &finding.differences {
        text += &format!("  {d}\n");
    }
    write_file(&out.join("summary.txt"), text.as_bytes())?;
    Ok(FuzzOutcome::Differ(Box::new(finding)))
}
