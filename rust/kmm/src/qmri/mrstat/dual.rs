//! Forward-mode automatic differentiation: dual numbers a + b ε with ε² = 0, and complex numbers
//! over any [`Real`] scalar.
//!
//! A function f written generically over [`Real`] and evaluated at `Dual { v: x, d: 1 }` returns
//! `Dual { v: f(x), d: f'(x) }`: every arithmetic operation and elementary function propagates the
//! derivative by the chain rule, so the derivative is exact (up to f64 rounding), not a finite
//! difference. Evaluated at plain `f64`, the same code is the ordinary f64 computation.

use std::ops::{Add, Div, Mul, Neg, Sub};

/// The scalar operations the simulations use: implemented by `f64` (plain evaluation) and by
/// [`Dual`] (value and derivative).
pub trait Real:
    Copy + Add<Output = Self> + Sub<Output = Self> + Mul<Output = Self> + Div<Output = Self> + Neg<Output = Self> + Send + Sync
{
    /// A constant (zero derivative).
    fn cst(x: f64) -> Self;
    /// The value part.
    fn value(self) -> f64;
    /// Multiplication by a constant.
    fn scale(self, k: f64) -> Self;
    fn sin_cos(self) -> (Self, Self);
    fn cos(self) -> Self {
        self.sin_cos().1
    }
    fn sin(self) -> Self {
        self.sin_cos().0
    }
    fn exp(self) -> Self;
    fn sqrt(self) -> Self;
}

impl Real for f64 {
    fn cst(x: f64) -> f64 {
        x
    }
    fn value(self) -> f64 {
        self
    }
    fn scale(self, k: f64) -> f64 {
        self * k
    }
    fn sin_cos(self) -> (f64, f64) {
        f64::sin_cos(self)
    }
    fn exp(self) -> f64 {
        f64::exp(self)
    }
    fn sqrt(self) -> f64 {
        f64::sqrt(self)
    }
}

/// A dual number `v + d ε`: a value and its derivative with respect to one parameter.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Dual {
    pub v: f64,
    pub d: f64,
}

impl Dual {
    /// The independent variable: value `x`, derivative 1.
    pub fn var(x: f64) -> Dual {
        Dual { v: x, d: 1.0 }
    }
}

impl Add for Dual {
    type Output = Dual;
    fn add(self, o: Dual) -> Dual {
        Dual { v: self.v + o.v, d: self.d + o.d }
    }
}
impl Sub for Dual {
    type Output = Dual;
    fn sub(self, o: Dual) -> Dual {
        Dual { v: self.v - o.v, d: self.d - o.d }
    }
}
impl Mul for Dual {
    type Output = Dual;
    fn mul(self, o: Dual) -> Dual {
        Dual { v: self.v * o.v, d: self.d * o.v + self.v * o.d }
    }
}
impl Div for Dual {
    type Output = Dual;
    /// (a/b)' = (a' - (a/b) b') / b, written so that b = +Inf (T = Inf: no relaxation) gives a
    /// zero derivative instead of NaN.
    fn div(self, o: Dual) -> Dual {
        let q = self.v / o.v;
        Dual { v: q, d: (self.d - q * o.d) / o.v }
    }
}
impl Neg for Dual {
    type Output = Dual;
    fn neg(self) -> Dual {
        Dual { v: -self.v, d: -self.d }
    }
}

impl Real for Dual {
    fn cst(x: f64) -> Dual {
        Dual { v: x, d: 0.0 }
    }
    fn value(self) -> f64 {
        self.v
    }
    fn scale(self, k: f64) -> Dual {
        Dual { v: self.v * k, d: self.d * k }
    }
    fn sin_cos(self) -> (Dual, Dual) {
        let (s, c) = self.v.sin_cos();
        (Dual { v: s, d: c * self.d }, Dual { v: c, d: -s * self.d })
    }
    fn exp(self) -> Dual {
        let e = self.v.exp();
        Dual { v: e, d: e * self.d }
    }
    fn sqrt(self) -> Dual {
        let r = self.v.sqrt();
        Dual { v: r, d: self.d / (2.0 * r) }
    }
}

/// A complex number over a [`Real`] scalar.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Cx<T> {
    pub re: T,
    pub im: T,
}

impl<T: Real> Cx<T> {
    pub fn new(re: T, im: T) -> Cx<T> {
        Cx { re, im }
    }
    pub fn zero() -> Cx<T> {
        Cx { re: T::cst(0.0), im: T::cst(0.0) }
    }
    /// A constant complex number.
    pub fn cst(re: f64, im: f64) -> Cx<T> {
        Cx { re: T::cst(re), im: T::cst(im) }
    }
    /// exp(i θ).
    pub fn cis(theta: T) -> Cx<T> {
        let (s, c) = theta.sin_cos();
        Cx { re: c, im: s }
    }
    pub fn conj(self) -> Cx<T> {
        Cx { re: self.re, im: -self.im }
    }
    /// Multiplication by a real scalar.
    pub fn scale(self, k: T) -> Cx<T> {
        Cx { re: self.re * k, im: self.im * k }
    }
    /// Multiplication by a real constant.
    pub fn scale_c(self, k: f64) -> Cx<T> {
        Cx { re: self.re.scale(k), im: self.im.scale(k) }
    }
    /// Multiplication by i.
    pub fn mul_i(self) -> Cx<T> {
        Cx { re: -self.im, im: self.re }
    }
}

impl Cx<Dual> {
    /// The value part as an (re, im) pair.
    pub fn value_pair(self) -> [f64; 2] {
        [self.re.v, self.im.v]
    }
    /// The derivative part as an (re, im) pair.
    pub fn deriv_pair(self) -> [f64; 2] {
        [self.re.d, self.im.d]
    }
}

impl<T: Real> Add for Cx<T> {
    type Output = Cx<T>;
    fn add(self, o: Cx<T>) -> Cx<T> {
        Cx { re: self.re + o.re, im: self.im + o.im }
    }
}
impl<T: Real> Sub for Cx<T> {
    type Output = Cx<T>;
    fn sub(self, o: Cx<T>) -> Cx<T> {
        Cx { re: self.re - o.re, im: self.im - o.im }
    }
}
impl<T: Real> Mul for Cx<T> {
    type Output = Cx<T>;
    fn mul(self, o: Cx<T>) -> Cx<T> {
        Cx { re: self.re * o.re - self.im * o.im, im: self.re * o.im + self.im * o.re }
    }
}

/// exp(-dt / t) (relaxation over `dt` seconds with time constant `t`), with t = +Inf giving 1
/// and a zero derivative.
pub fn relax<T: Real>(dt: f64, t: T) -> T {
    (T::cst(-dt) / t).exp()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dual_rules() {
        // f(x) = exp(-0.3 / x) * sin(2x) + sqrt(x) / (1 + x^2) at x = 0.7, against the hand derivative.
        let x = 0.7f64;
        let f = |x: Dual| relax(0.3, x) * (x.scale(2.0)).sin() + x.sqrt() / (Dual::cst(1.0) + x * x);
        let y = f(Dual::var(x));
        let e = (-0.3 / x).exp();
        let want_v = e * (2.0 * x).sin() + x.sqrt() / (1.0 + x * x);
        let want_d = e * 0.3 / (x * x) * (2.0 * x).sin()
            + e * 2.0 * (2.0 * x).cos()
            + (0.5 / x.sqrt() * (1.0 + x * x) - x.sqrt() * 2.0 * x) / (1.0 + x * x).powi(2);
        println!("dual_rules: value {:.3e} derivative {:.3e} relative error", (y.v - want_v).abs() / want_v.abs(), (y.d - want_d).abs() / want_d.abs());
        assert!((y.v - want_v).abs() <= 1e-14 * want_v.abs());
        assert!((y.d - want_d).abs() <= 1e-13 * want_d.abs());
        // T = Inf: no relaxation, zero derivative.
        let r = relax(0.01, Dual::var(f64::INFINITY));
        assert_eq!((r.v, r.d), (1.0, 0.0));
        // Complex product rule: d/dx (cis(x) * (x + 2i)) = i cis(x) (x + 2i) + cis(x).
        let z = Cx::cis(Dual::var(x)) * Cx::new(Dual::var(x), Dual::cst(2.0));
        let (c, s) = (x.cos(), x.sin());
        let want = [-s * x - c * 2.0 + c, c * x - s * 2.0 + s];
        assert!((z.re.d - want[0]).abs() < 1e-14 && (z.im.d - want[1]).abs() < 1e-14, "{z:?} vs {want:?}");
    }
}
