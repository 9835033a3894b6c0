fn main() {
    println!("splitgrad: training arrives with a later release");
}
