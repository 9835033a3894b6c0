//! The tile kernel against its naive twin.
//!
//! One harness for every variant of the micro-kernel this CPU can run
//! (the scalar reference always, AVX2 + FMA where the CPU has it): the
//! general product against the textbook product on shapes that cover every
//! edge (1 row, partial tiles, k across blocks), strided and transposed
//! operands and both modes (overwrite, accumulate); and the tile kernel on
//! operands read in blocks. Every variant must give the scalar reference's
//! bits, and every thread count the same bits.

use ndarray::{Array2, ArrayView2, s};
use splitgrad::Rng;
use splitgrad::kernels::gemm::micro::{Dst, Lhs, NR, Rhs, Tile};
use splitgrad::kernels::gemm::{Isa, gemm, gemm_naive};

fn variants() -> Vec<Isa> {
    Isa::ALL.into_iter().filter(|i| i.available()).collect()
}

fn random(rng: &mut Rng, rows: usize, cols: usize, scale: f64) -> Array2<f32> {
    Array2::from_shape_fn((rows, cols), |_| (scale * rng.normal()) as f32)
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
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
        gemm(
            isa,
            empty.view(),
            Array2::zeros((0, 11)).view(),
            c.view_mut(),
            true,
        );
        assert!(c.iter().all(|&x| x == 3.0), "accumulating nothing");
        gemm(
            isa,
            empty.view(),
            Array2::zeros((0, 11)).view(),
            c.view_mut(),
            false,
        );
        assert!(c.iter().all(|&x| x == 0.0), "a product over nothing is 0");
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
            pool(threads).install(|| {
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
