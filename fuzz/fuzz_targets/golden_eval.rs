#![no_main]

use libfuzzer_sys::fuzz_target;
use splitgrad_fuzz::bodies;

fuzz_target!(|data: &[u8]| bodies::golden_eval(data));
