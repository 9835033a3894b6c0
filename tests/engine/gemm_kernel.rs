//! The tile kernel and the fused head on it against their naive twins.
//!
//! One harness for every variant of the micro-kernel this CPU can run
//! (the scalar reference always, AVX2 + FMA where the CPU has it): the
//! general product against the textbook product on shapes that cover every
//! edge (1 row, partial tiles, k across blocks), strided and transposed
//! operands and both modes (overwrite, accumulate); the tile kernel on
//! operands read in blocks; and the fused head's three passes against a
//! from-scratch f64 computation of the losses, the statistics and the
//! gradients, for split vocabularies, rows shared by several tokens, every
//! chunking, and logits in the thousands (which raise the per-row shift).
//! Every variant must give the scalar reference's bits, and every thread
//! count the same bits.

use ndarray::{Array2, ArrayView2, s};
use splitgrad::Rng;
use splitgrad::kernels::gemm::micro::{Dst, Lhs, NR, Rhs, Tile};
use splitgrad::kernels::gemm::{Isa, gemm, gemm_naive, head};
use splitgrad::kernels::pool::Pool;

fn variants() -> Vec<Isa> {
    Isa::ALL.into_iter().filter(|i| i.available()).collect()
}

fn random(rng: &mut Rng, rows: usize, cols: usize, scale: f64) -> Array2<f32> {
    Array2::from_shape_fn((rows, cols), |_| (scale * rng.normal()) as f32)
}

fn same_bits(a: &Array2<f32>, b: &Array2<f32>) -> bool {
    a.shape() == b.shape() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// |c − want| within f32 rounding of Σ_k |a_ik·b_kj| (plus |c0| when
/// accumulating).
fn assert_product(
    c: &Array2<f32>,
    a: ArrayView2<'_, f32>,
    b: ArrayView2<'_, f32>,
    c0: Option<&Array2<f32>>,
    what: &str,
) {
    let want = gemm_naive(a, b);
    let mag = gemm_naive(a.mapv(f32::abs).view(), b.mapv(f32::abs).view());
    for ((i, j), &x) in c.indexed_iter() {
        let (w, m) = match c0 {
            Some(c0) => (want[[i, j]] + c0[[i, j]], mag[[i, j]] + c0[[i, j]].abs()),
            None => (want[[i, j]], mag[[i, j]]),
        };
        let tol = 4e-7 * (a.ncols() as f32 + 2.0) * m + 1e-30;
        assert!(
            (x - w).abs() <= tol,
            "{what}: c[{i}, {j}] = {x}, want {w} (±{tol})"
        );
    }
}

#[test]
fn every_variant_equals_the_naive_product_on_every_shape() {
    let mut rng = Rng::new(21);
    let shapes = [
        (1, 1, 1),
        (1, 7, 16),
        (5, 3, 17),
        (6, 16, 16),
        (7, 300, 33),
        (13, 257, 40),
        (80, 70, 2100),
        (75, 520, 31),
    ];
    for &(m, k, n) in &shapes {
        let a = random(&mut rng, m, k, 1.0);
        let at = random(&mut rng, k, m, 1.0); // read transposed
        let b = random(&mut rng, k, n, 1.0);
        let bw = random(&mut rng, k, 2 * n, 1.0); // every other column
        let c0 = random(&mut rng, m, n, 1.0);
        let operands: [(ArrayView2<'_, f32>, ArrayView2<'_, f32>, &str); 3] = [
            (a.view(), b.view(), "standard"),
            (at.t(), b.view(), "a transposed"),
            (a.view(), bw.slice(s![.., ..;2]), "b strided"),
        ];
        for (av, bv, layout) in operands {
            for accumulate in [false, true] {
                let mut reference: Option<Array2<f32>> = None;
                for isa in variants() {
                    let mut c = if accumulate {
                        c0.clone()
                    } else {
                        Array2::from_elem((m, n), f32::NAN)
                    };
                    gemm(isa, av, bv, c.view_mut(), accumulate);
                    let what = format!("{isa:?} ({m}, {k}, {n}) {layout} accumulate {accumulate}");
                    assert_product(&c, av, bv, accumulate.then_some(&c0), &what);
                    match &reference {
                        None => reference = Some(c),
                        Some(r) => assert!(same_bits(r, &c), "{what}: not the scalar bits"),
                    }
                }
            }
        }
    }
}

#[test]
fn a_transposed_output_and_an_empty_inner_size() {
    let mut rng = Rng::new(22);
    let (a, b) = (random(&mut rng, 9, 20, 1.0), random(&mut rng, 20, 11, 1.0));
    for isa in variants() {
        let mut ct = Array2::<f32>::zeros((11, 9));
        gemm(
            isa,
            a.view(),
            b.view(),
            ct.view_mut().reversed_axes(),
            false,
        );
        assert_product(&ct.t().to_owned(), a.view(), b.view(), None, "c transposed");
        let mut c = Array2::from_elem((9, 11), 3.0f32);
        let empty = Array2::<f32>::zeros((9, 0));
        for (accumulate, want, what) in [
            (true, 3.0, "accumulating nothing"),
            (false, 0.0, "a product over nothing is 0"),
        ] {
            let b = Array2::zeros((0, 11));
            gemm(isa, empty.view(), b.view(), c.view_mut(), accumulate);
            assert!(c.iter().all(|&x| x == want), "{what}");
        }
    }
}

#[test]
fn the_tile_kernel_reads_operands_in_blocks_of_k() {
    // A(r, k) in blocks of 16 k, one block after another (the layout the
    // head's ∂W product reads its logits' exponentials in), B with a row
    // step wider than 16.
    let mut rng = Rng::new(23);
    let (k, bs): (usize, usize) = (16 * 5 + 7, 16 * 6 + 3);
    let blocks = k.div_ceil(16);
    let araw: Vec<f32> = (0..blocks * bs).map(|_| rng.normal() as f32).collect();
    let braw: Vec<f32> = (0..k * 20).map(|_| rng.normal() as f32).collect();
    let a_at = |r: usize, kk: usize| araw[(kk / 16) * bs + r * 16 + kk % 16];
    for rows in 1..=6 {
        let mut reference: Option<Tile> = None;
        for isa in variants() {
            let mut t: Tile = [[1.5; NR]; 6];
            let lhs = Lhs {
                ptr: araw.as_ptr(),
                rs: 16,
                cs: 1,
                kb: 16,
                bs,
            };
            let rhs = Rhs {
                ptr: braw.as_ptr(),
                rs: 20,
            };
            // SAFETY: A(r, kk) for r < 6, kk < k is at most
            // (blocks − 1)·bs + 5·16 + 15 < blocks·bs, and B(kk, 0..16) at
            // kk·20 + 15 < k·20.
            unsafe { isa.tile_fn()(k, rows, lhs, rhs, Dst::tile(&mut t), true) };
            for (r, row) in t.iter().enumerate() {
                for (j, &x) in row.iter().enumerate() {
                    if r >= rows {
                        assert_eq!(x, 1.5, "{isa:?}: row {r} past {rows} untouched");
                        continue;
                    }
                    let want: f64 = 1.5
                        + (0..k)
                            .map(|kk| a_at(r, kk) as f64 * braw[kk * 20 + j] as f64)
                            .sum::<f64>();
                    assert!(
                        (x as f64 - want).abs() < 1e-4,
                        "{isa:?} ({r}, {j}): {x} vs {want}"
                    );
                }
            }
            match &reference {
                None => reference = Some(t),
                Some(r) => assert!(
                    r.iter()
                        .flatten()
                        .zip(t.iter().flatten())
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{isa:?}: not the scalar bits"
                ),
            }
        }
    }
}

#[test]
fn the_product_is_the_same_bits_on_any_thread_count() {
    let mut rng = Rng::new(24);
    let (a, b) = (
        random(&mut rng, 300, 600, 1.0),
        random(&mut rng, 600, 70, 1.0),
    );
    for isa in variants() {
        let run = |threads: usize| {
            crate::common::threads(threads).install(|| {
                let mut c = Array2::zeros((300, 70));
                gemm(isa, a.view(), b.view(), c.view_mut(), false);
                c
            })
        };
        let one = run(1);
        assert!(
            same_bits(&one, &run(2)) && same_bits(&one, &run(4)),
            "{isa:?}"
        );
    }
}

/// A head problem: rows of h, split weights, each row's tokens.
struct Problem {
    h: Array2<f32>,
    ws: Vec<Array2<f32>>,
    rows: Vec<usize>,
    starts: Vec<usize>,
    labels: Vec<usize>,
    /// Each token's weight (its loss's upstream gradient).
    gy: Vec<f32>,
}

impl Problem {
    fn new(rng: &mut Rng, n_h: usize, hd: usize, sizes: &[usize], scale: f64) -> Self {
        let h = random(rng, n_h, hd, scale);
        let ws: Vec<Array2<f32>> = sizes.iter().map(|&v| random(rng, v, hd, scale)).collect();
        let v: usize = sizes.iter().sum();
        // Every other row of h, some with several tokens (a label repeated).
        let rows: Vec<usize> = (0..n_h).step_by(2).collect();
        let mut starts = vec![0];
        let mut labels = Vec::new();
        for (a, _) in rows.iter().enumerate() {
            let n = 1 + (a % 3 == 1) as usize * 2;
            for t in 0..n {
                let l = if t == 2 {
                    labels[labels.len() - 1]
                } else {
                    rng.below(v as u64) as usize
                };
                labels.push(l);
            }
            starts.push(labels.len());
        }
        let gy = (0..labels.len()).map(|_| rng.normal() as f32).collect();
        Problem {
            h,
            ws,
            rows,
            starts,
            labels,
            gy,
        }
    }

    fn w(&self) -> Array2<f64> {
        let views: Vec<ArrayView2<'_, f32>> = self.ws.iter().map(|w| w.view()).collect();
        ndarray::concatenate(ndarray::Axis(0), &views)
            .unwrap()
            .mapv(f64::from)
    }

    /// In f64 from scratch: each row's max and log-sum, each token's loss,
    /// and the gradients of Σ_n w_n·loss_n (w = 1, or `gy`).
    fn naive(&self, weighted: bool) -> Naive {
        let w = self.w();
        let h = self.h.mapv(f64::from);
        let (mut max, mut ls, mut loss) = (vec![], vec![], vec![0.0; self.labels.len()]);
        let mut gh = Array2::<f64>::zeros(h.dim());
        let mut gw = Array2::<f64>::zeros(w.dim());
        for (a, &r) in self.rows.iter().enumerate() {
            let z = w.dot(&h.row(r));
            let m = z.fold(f64::NEG_INFINITY, |x, &y| x.max(y));
            let l = z.mapv(|x| (x - m).exp()).sum().ln();
            max.push(m);
            ls.push(l);
            let toks = self.starts[a]..self.starts[a + 1];
            let wt = |n: usize| if weighted { self.gy[n] as f64 } else { 1.0 };
            let wsum: f64 = toks.clone().map(wt).sum();
            let mut g = z.mapv(|x| wsum * ((x - m) - l).exp());
            for n in toks {
                loss[n] = (m - z[self.labels[n]]) + l;
                g[self.labels[n]] -= wt(n);
            }
            gh.row_mut(r).assign(&g.dot(&w));
            for (v, &gv) in g.iter().enumerate() {
                gw.row_mut(v).scaled_add(gv, &h.row(r));
            }
        }
        (max, ls, loss, gh, gw)
    }
}

/// Each row's max and log-sum, each token's loss, ∂h and ∂W concatenated.
type Naive = (Vec<f64>, Vec<f64>, Vec<f64>, Array2<f64>, Array2<f64>);

/// One call of the fused head: (stats, ∂h, ∂W concatenated).
fn run_head(
    isa: Isa,
    p: &Problem,
    pass: head::Pass<'_>,
    chunk: usize,
    block: usize,
) -> (head::Stats, Array2<f32>, Array2<f32>) {
    run_head_in(&Pool::new(), isa, p, pass, chunk, block)
}

/// [`run_head`] with its workspace from `pool`.
fn run_head_in(
    pool: &Pool<f32>,
    isa: Isa,
    p: &Problem,
    pass: head::Pass<'_>,
    chunk: usize,
    block: usize,
) -> (head::Stats, Array2<f32>, Array2<f32>) {
    let mut gh = Array2::<f32>::zeros(p.h.dim());
    let mut gws: Vec<Array2<f32>> = p.ws.iter().map(|w| Array2::zeros(w.dim())).collect();
    let views: Vec<ArrayView2<'_, f32>> = p.ws.iter().map(|w| w.view()).collect();
    let stats = {
        let mut out = head::Out {
            hidden: Some(gh.view_mut()),
            weights: gws.iter_mut().map(|g| Some(g.view_mut())).collect(),
        };
        let rows = head::Rows {
            rows: &p.rows,
            starts: &p.starts,
            labels: &p.labels,
        };
        head::fused_ce(
            isa,
            pool,
            p.h.view(),
            &views,
            rows,
            pass,
            chunk,
            block,
            &mut out,
        )
    };
    let gv: Vec<ArrayView2<'_, f32>> = gws.iter().map(|g| g.view()).collect();
    (
        stats,
        gh,
        ndarray::concatenate(ndarray::Axis(0), &gv).unwrap(),
    )
}

fn assert_near(got: &Array2<f32>, want: &Array2<f64>, rel: f64, what: &str) {
    let scale = want.iter().fold(1e-3f64, |m, &x| m.max(x.abs()));
    for ((i, j), &x) in got.indexed_iter() {
        let w = want[[i, j]];
        assert!(
            (x as f64 - w).abs() <= rel * scale,
            "{what}: [{i}, {j}] = {x}, want {w} (scale {scale})"
        );
    }
}

fn check_problem(p: &Problem, rel: f64, what: &str) {
    let (max, ls, loss, gh1, gw1) = p.naive(false);
    let (_, _, _, ghw, gww) = p.naive(true);
    let loss_scale = loss.iter().fold(1.0f64, |m, &x| m.max(x.abs()));
    for (chunk, block) in [(1, 1), (3, 7), (16, 1000), (17, 64), (1000, usize::MAX)] {
        let mut reference: Option<Vec<Array2<f32>>> = None;
        for isa in variants() {
            let what = format!("{what}, {isa:?}, chunk {chunk}, block {block}");
            let (st, gh0, gw0) = run_head(isa, p, head::Pass::Loss, chunk, block);
            assert!(
                gh0.iter().chain(&gw0).all(|&x| x == 0.0),
                "{what}: a loss pass adds nothing"
            );
            for a in 0..p.rows.len() {
                assert!(
                    (st.max[a] as f64 - max[a]).abs() <= rel * max[a].abs().max(1.0),
                    "{what}: max"
                );
                let lse = st.max[a] as f64 + st.log_sum[a] as f64;
                assert!(
                    (lse - (max[a] + ls[a])).abs() <= rel * loss_scale,
                    "{what}: lse"
                );
            }
            for (n, (&l, &w)) in st.loss.iter().zip(&loss).enumerate() {
                assert!(
                    (l as f64 - w).abs() <= rel * loss_scale,
                    "{what}: loss {n}: {l} vs {w}"
                );
            }
            let (st2, gh, gw) = run_head(isa, p, head::Pass::LossAndGrads, chunk, block);
            assert_eq!(
                st2.loss, st.loss,
                "{what}: the loss with gradients is the same bits"
            );
            assert_near(&gh, &gh1, rel, &format!("{what}: ∂h"));
            assert_near(&gw, &gw1, rel, &format!("{what}: ∂W"));
            let given = head::Pass::Grads {
                max: &st.max,
                log_sum: &st.log_sum,
                weights: &p.gy,
            };
            let (_, ghg, gwg) = run_head(isa, p, given, chunk, block);
            assert_near(&ghg, &ghw, rel, &format!("{what}: weighted ∂h"));
            assert_near(&gwg, &gww, rel, &format!("{what}: weighted ∂W"));
            let got = vec![
                gh,
                gw,
                ghg,
                gwg,
                Array2::from_shape_vec((1, st.loss.len()), st.loss).unwrap(),
            ];
            match &reference {
                None => reference = Some(got),
                Some(r) => {
                    for (x, y) in r.iter().zip(&got) {
                        assert!(same_bits(x, y), "{what}: not the scalar bits");
                    }
                }
            }
        }
    }
}

#[test]
fn head_passes_equal_the_naive_twin() {
    let mut rng = Rng::new(31);
    check_problem(
        &Problem::new(&mut rng, 19, 5, &[7, 0, 10], 1.0),
        1e-4,
        "three splits, H 5",
    );
    check_problem(&Problem::new(&mut rng, 70, 33, &[40, 3], 0.7), 1e-4, "H 33");
    check_problem(
        &Problem::new(&mut rng, 40, 16, &[100], 0.5),
        1e-4,
        "one split",
    );
}

#[test]
fn logits_in_the_thousands_raise_the_shift() {
    // Logits of N(0, 900·H·900): a later tile exceeds the first one's
    // maximum by far more than the margin, so the rows' shifts are raised
    // and their earlier exponentials rescaled.
    let mut rng = Rng::new(32);
    let p = Problem::new(&mut rng, 12, 6, &[50, 9], 30.0);
    check_problem(&p, 1e-4, "huge logits");
}

#[test]
fn the_head_is_the_same_bits_on_any_thread_count() {
    let mut rng = Rng::new(33);
    let p = Problem::new(&mut rng, 150, 24, &[90, 31], 1.0);
    for isa in variants() {
        let run = |threads: usize| {
            crate::common::threads(threads).install(|| {
                let (st, gh, gw) = run_head(isa, &p, head::Pass::LossAndGrads, 40, usize::MAX);
                let given = head::Pass::Grads {
                    max: &st.max,
                    log_sum: &st.log_sum,
                    weights: &p.gy,
                };
                let (_, ghg, gwg) = run_head(isa, &p, given, 40, 30);
                (st, [gh, gw, ghg, gwg])
            })
        };
        let (s1, g1) = run(1);
        for threads in [2, 4] {
            let (s, g) = run(threads);
            assert_eq!(s, s1, "{isa:?}, {threads} threads: statistics");
            for (a, b) in g1.iter().zip(&g) {
                assert!(same_bits(a, b), "{isa:?}, {threads} threads: gradients");
            }
        }
    }
}

/// The head's workspace goes back to the pool it came from, so that a
/// training loop with one pool allocates (and the kernel faults in) E once,
/// not at every step.
#[test]
fn the_head_gives_its_workspace_back_to_the_pool() {
    let mut rng = Rng::new(11);
    // 32 rows against 8192 words: E is 32 × 8192 floats (1 MiB), which the
    // pool keeps; W packed for ∂h is 8192·6·⌈16/6⌉ floats.
    let p = Problem::new(&mut rng, 64, 16, &[8000, 192], 0.5);
    for isa in variants() {
        let pool = Pool::<f32>::new();
        let mut held = Vec::new();
        for _ in 0..3 {
            run_head_in(
                &pool,
                isa,
                &p,
                head::Pass::LossAndGrads,
                usize::MAX,
                usize::MAX,
            );
            held.push(pool.held_bytes());
        }
        let e_bytes = 32 * 8192 * 4;
        assert!(
            held[0] >= e_bytes,
            "{isa:?}: the pool holds {} bytes after a call, not E's {e_bytes}",
            held[0]
        );
        assert!(
            held.windows(2).all(|w| w[0] == w[1]),
            "{isa:?}: the pool grew from call to call: {held:?}"
        );
    }
}
