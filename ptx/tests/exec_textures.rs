//! Texture and surface instructions on the interpreter. CUDA programs (`tests/exec_data/textures.cu`, `surfaces.cu`)
//! compiled with nvcc sample texture objects and read and write surface objects built here, and every result is
//! checked against a host reference written from the CUDA Programming Guide's texture-fetching rules (nearest-point
//! sampling, linear filtering with 8-bit fractional weights, the addressing modes, normalized-float reads). When
//! `tests/exec_data/texture_probe_h100.txt` exists, the cases `texture_probe.cu` ran on an H100 are replayed and
//! compared bit for bit.

#![allow(clippy::needless_range_loop)] // results are checked index by index

mod common;

use std::sync::Arc;

use common::*;
use phos_ptx::exec::{
    AddressMode, ArrayDesc, ArrayKind, ChannelFormat, ChannelType, ExecError, FilterMode, Level, ReadMode, Resource,
    ResourceTable, Surface, Texture, TextureDesc,
};

/// One lookup's inputs, as `textures.cu` declares them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Coord {
    x: f32,
    y: f32,
    z: f32,
    layer: i32,
    lod: f32,
    dx: [f32; 2],
    dy: [f32; 2],
    comp: i32,
}

fn at(x: f32, y: f32) -> Coord {
    Coord { x, y, ..Coord::default() }
}

// ----- images in host memory -----

/// An image in host buffers, one per level, with padded rows and slices so that pitches matter.
struct TestImage {
    format: ChannelFormat,
    kind: ArrayKind,
    layers: u32,
    levels: Vec<(Buf, Level)>,
}

impl TestImage {
    /// Channel `ch` of texel `(x, y, z)` of `layer` at `level` holds the raw bits `f(level, layer, x, y, z, ch)`.
    fn new(
        format: ChannelFormat,
        kind: ArrayKind,
        extent: [u32; 3],
        layers: u32,
        nlevels: u32,
        f: impl Fn(u32, u32, u32, u32, u32, u32) -> u32,
    ) -> TestImage {
        let esize = format.element_size() as u64;
        let csize = format.ty.bytes() as usize;
        let mut levels = Vec::new();
        for lv in 0..nlevels {
            let dim = |k: usize| (extent[k] >> lv).max(1);
            let (w, h, d) = (dim(0), dim(1), dim(2));
            let row_pitch = (w as u64 * esize).next_multiple_of(16) + 16;
            let slice_pitch = row_pitch * h as u64 + 32;
            let mut buf = Buf::zeroed((slice_pitch * (d * layers) as u64) as usize);
            let base = buf.addr();
            let bytes = buf.bytes_mut();
            for l in 0..layers {
                for z in 0..d {
                    for y in 0..h {
                        for x in 0..w {
                            let off =
                                ((l * d + z) as u64 * slice_pitch + y as u64 * row_pitch + x as u64 * esize) as usize;
                            for ch in 0..format.channels as u32 {
                                let v = f(lv, l, x, y, z, ch).to_le_bytes();
                                let o = off + ch as usize * csize;
                                bytes[o..o + csize].copy_from_slice(&v[..csize]);
                            }
                        }
                    }
                }
            }
            levels.push((buf, Level { base, width: w, height: h, depth: d, row_pitch, slice_pitch }));
        }
        TestImage { format, kind, layers, levels }
    }

    fn desc(&self) -> ArrayDesc {
        ArrayDesc {
            format: self.format,
            kind: self.kind,
            layers: self.layers,
            levels: self.levels.iter().map(|(_, l)| *l).collect(),
        }
    }

    /// The raw channels of a texel, read back from the buffer.
    fn raw(&self, lv: usize, layer: u32, x: u32, y: u32, z: u32) -> [u32; 4] {
        let (buf, l) = &self.levels[lv];
        let esize = self.format.element_size() as u64;
        let csize = self.format.ty.bytes() as usize;
        let off = ((layer * l.depth + z) as u64 * l.slice_pitch + y as u64 * l.row_pitch + x as u64 * esize) as usize;
        let mut out = [0u32; 4];
        for ch in 0..self.format.channels as usize {
            let mut b = [0u8; 4];
            b[..csize].copy_from_slice(&buf.bytes()[off + ch * csize..off + (ch + 1) * csize]);
            out[ch] = u32::from_le_bytes(b);
        }
        out
    }

    fn bufs(&self) -> Vec<&Buf> {
        self.levels.iter().map(|(b, _)| b).collect()
    }
}

fn fmt(ty: ChannelType, channels: u8) -> ChannelFormat {
    ChannelFormat::new(ty, channels).unwrap()
}

fn desc(address: [AddressMode; 3], filter: FilterMode, read: ReadMode, normalized: bool) -> TextureDesc {
    TextureDesc {
        address,
        filter,
        read,
        normalized_coords: normalized,
        border_color: [0.25, -2.0, 7.5, 1e9],
        ..TextureDesc::default()
    }
}

// ----- the reference, from the CUDA Programming Guide -----

#[derive(Clone, Copy, PartialEq, Debug)]
enum G {
    D1,
    D2,
    D3,
    L1,
    L2,
    Cube,
    LCube,
}

/// A texture as the reference sees it: the image (or linear memory) and the description.
struct Ref<'a> {
    img: &'a TestImage,
    d: TextureDesc,
    mipmapped: bool,
}

impl Ref<'_> {
    fn returns_float(&self) -> bool {
        self.img.format.ty.is_float() || self.d.read == ReadMode::NormalizedFloat
    }

    /// A texel as the texture returns it: floats (as bits) or integers; missing channels are (0, 0, 0, 1).
    fn texel(&self, lv: usize, layer: u32, x: u32, y: u32, z: u32) -> [u32; 4] {
        let raw = self.img.raw(lv, layer, x, y, z);
        let f = self.img.format;
        let norm = self.d.read == ReadMode::NormalizedFloat;
        let mut out = [0, 0, 0, if self.returns_float() { 1f32.to_bits() } else { 1 }];
        for ch in 0..f.channels as usize {
            let r = raw[ch];
            out[ch] = match f.ty {
                ChannelType::F32 => r,
                ChannelType::F16 => half_to_f32(r as u16).to_bits(),
                // Unsigned n-bit integers map to [0, 1] as x / (2^n - 1), signed ones to [-1, 1] as x / (2^(n-1) - 1)
                // (the most negative value also reads -1).
                ChannelType::U8 if norm => {
                    let v = r as f32 / 255.0;
                    if self.d.srgb && ch < 3 { srgb(v) } else { v }.to_bits()
                }
                ChannelType::U16 if norm => (r as f32 / 65535.0).to_bits(),
                ChannelType::S8 if norm => f32::max(r as u8 as i8 as f32 / 127.0, -1.0).to_bits(),
                ChannelType::S16 if norm => f32::max(r as u16 as i16 as f32 / 32767.0, -1.0).to_bits(),
                ChannelType::S8 => r as u8 as i8 as i32 as u32,
                ChannelType::S16 => r as u16 as i16 as i32 as u32,
                _ => r,
            };
        }
        out
    }

    fn border(&self) -> [u32; 4] {
        self.d.border_color.map(f32::to_bits)
    }

    /// Texel index for integer coordinate `i` along a dimension of `n` texels, or None for the border.
    fn wrap(&self, i: i64, n: u32, mode: AddressMode, normalized: bool) -> Option<u32> {
        let n = n as i64;
        let mode = if normalized || mode == AddressMode::Border { mode } else { AddressMode::Clamp };
        match mode {
            AddressMode::Clamp => Some(i.max(0).min(n - 1) as u32),
            AddressMode::Border => (i >= 0 && i < n).then_some(i as u32),
            AddressMode::Wrap => Some((((i % n) + n) % n) as u32),
            AddressMode::Mirror => {
                // OpenGL's mirrored repeat: (n - 1) - mirror((i mod 2n) - n), mirror(a) = a >= 0 ? a : -(1 + a).
                let a = (((i % (2 * n)) + 2 * n) % (2 * n)) - n;
                let m = if a >= 0 { a } else { -(1 + a) };
                Some((n - 1 - m) as u32)
            }
        }
    }

    /// One level: nearest point or linear filtering over `dims` dimensions.
    fn level(&self, dims: usize, lv: usize, layer: u32, pos: [f32; 3], normalized: bool) -> [u32; 4] {
        let l = &self.img.levels[lv].1;
        let size = [l.width, l.height, l.depth];
        // Texel-space coordinates; a NaN coordinate reads as 0.
        let u: Vec<f32> = (0..dims)
            .map(|k| {
                let c = if pos[k].is_nan() { 0.0 } else { pos[k] };
                if normalized { c * size[k] as f32 } else { c }
            })
            .collect();
        if self.d.filter == FilterMode::Point || !self.returns_float() {
            let mut idx = [0u32; 3];
            for k in 0..dims {
                match self.wrap(u[k].floor() as i64, size[k], self.d.address[k], normalized) {
                    Some(i) => idx[k] = i,
                    None => return self.border(),
                }
            }
            return self.texel(lv, layer, idx[0], idx[1], idx[2]);
        }
        // tex(x) = (1 - a) T[i] + a T[i + 1] with i = floor(x - 0.5), a = frac(x - 0.5) in 1.8 fixed point; in more
        // dimensions the product of the fractions, rounded to 1.8 fixed point, weighs each corner.
        let mut lo = [0i64; 3];
        let mut a = [0f64; 3];
        for k in 0..dims {
            let xb = u[k] - 0.5;
            lo[k] = xb.floor() as i64;
            let frac = xb - xb.floor();
            a[k] = if frac.is_nan() { 0.0 } else { (frac as f64 * 256.0).round() / 256.0 };
        }
        let mut acc = [0f64; 4];
        for corner in 0..(1 << dims) {
            let mut w = 1f64;
            let mut idx = [0u32; 3];
            let mut inside = true;
            for k in 0..dims {
                let up = corner >> k & 1;
                w *= if up == 1 { a[k] } else { 1.0 - a[k] };
                match self.wrap(lo[k].saturating_add(up), size[k], self.d.address[k], normalized) {
                    Some(i) => idx[k] = i,
                    None => inside = false,
                }
            }
            // Each corner's weight is itself rounded to 1/256 (what an H100 reads at border addressing).
            if dims > 1 {
                w = (w * 256.0 + 0.5).floor() / 256.0;
            }
            if w == 0.0 {
                continue;
            }
            let t = if inside { self.texel(lv, layer, idx[0], idx[1], idx[2]) } else { self.border() };
            for ch in 0..4 {
                acc[ch] += w * f32::from_bits(t[ch]) as f64;
            }
        }
        acc.map(|v| (v as f32).to_bits())
    }

    /// The whole lookup of `textures.cu`'s kernels.
    fn sample(&self, g: G, c: &Coord) -> [u32; 4] {
        let layers = self.img.layers;
        let clamp_layer = |l: u32| l.min(layers - 1);
        let (dims, layer, pos, normalized) = match g {
            G::D1 => (1, 0, [c.x, 0.0, 0.0], self.d.normalized_coords),
            G::D2 => (2, 0, [c.x, c.y, 0.0], self.d.normalized_coords),
            G::D3 => (3, 0, [c.x, c.y, c.z], self.d.normalized_coords),
            G::L1 => (1, clamp_layer(c.layer as u32), [c.x, 0.0, 0.0], self.d.normalized_coords),
            G::L2 => (2, clamp_layer(c.layer as u32), [c.x, c.y, 0.0], self.d.normalized_coords),
            G::Cube | G::LCube => {
                let (face, s, t) = cube(c.x, c.y, c.z);
                let cube = if g == G::LCube { (c.layer as u32).min(layers / 6 - 1) } else { 0 };
                (2, cube * 6 + face, [s, t, 0.0], true)
            }
        };
        if !self.mipmapped {
            return self.level(dims, 0, layer, pos, normalized);
        }
        // Level of detail: the given one plus the bias, clamped, then the nearest level or a blend of two.
        let n = self.img.levels.len();
        let lambda = (c.lod + self.d.mipmap_level_bias)
            .max(self.d.min_mipmap_level_clamp)
            .min(self.d.max_mipmap_level_clamp)
            .clamp(0.0, (n - 1) as f32);
        if self.d.mipmap_filter == FilterMode::Point {
            let lv = if lambda - lambda.floor() <= 0.5 { lambda.floor() } else { lambda.ceil() } as usize;
            return self.level(dims, lv, layer, pos, normalized);
        }
        let lo = lambda.floor() as usize;
        let w = ((lambda - lambda.floor()) as f64 * 256.0).round() / 256.0;
        let a = self.level(dims, lo, layer, pos, normalized);
        if w == 0.0 || lo + 1 >= n {
            return a;
        }
        let b = self.level(dims, lo + 1, layer, pos, normalized);
        std::array::from_fn(|k| (f32::from_bits(a[k]) as f64 * (1.0 - w) + f32::from_bits(b[k]) as f64 * w) as f32)
            .map(f32::to_bits)
    }

    /// `tex2Dgather`: component `comp` of T[i, j+1], T[i+1, j+1], T[i+1, j], T[i, j], i = floor(x - 0.5).
    fn gather(&self, c: &Coord) -> [u32; 4] {
        let l = &self.img.levels[0].1;
        let norm = self.d.normalized_coords;
        let tx = |v: f32, n: u32| if norm { v * n as f32 } else { v };
        let i = (tx(c.x, l.width) - 0.5).floor() as i64;
        let j = (tx(c.y, l.height) - 0.5).floor() as i64;
        [(0, 1), (1, 1), (1, 0), (0, 0)].map(|(di, dj)| {
            let x = self.wrap(i + di, l.width, self.d.address[0], norm);
            let y = self.wrap(j + dj, l.height, self.d.address[1], norm);
            let t = match (x, y) {
                (Some(x), Some(y)) => self.texel(0, 0, x, y, 0),
                _ => self.border(),
            };
            t[c.comp as usize]
        })
    }
}

/// The cubemap face of a direction and the face coordinates, from the Programming Guide's table.
fn cube(x: f32, y: f32, z: f32) -> (u32, f32, f32) {
    let (ax, ay, az) = (x.abs(), y.abs(), z.abs());
    let (face, m, s, t) = if ax >= ay && ax >= az {
        if x >= 0.0 { (0, x, -z, -y) } else { (1, -x, z, -y) }
    } else if ay >= az {
        if y >= 0.0 { (2, y, x, z) } else { (3, -y, x, -z) }
    } else if z >= 0.0 {
        (4, z, x, -y)
    } else {
        (5, -z, -x, -y)
    };
    (face, (s / m + 1.0) / 2.0, (t / m + 1.0) / 2.0)
}

fn half_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let e = (h >> 10 & 0x1f) as i32;
    let m = (h & 0x3ff) as f32;
    sign * match e {
        0 => m * 2f32.powi(-24),
        31 if m == 0.0 => f32::INFINITY,
        31 => f32::NAN,
        _ => (1.0 + m / 1024.0) * 2f32.powi(e - 15),
    }
}

fn srgb(c: f32) -> f32 {
    let c = c as f64;
    (if c <= 0.04045 { c / 12.92 } else { ((c + 0.055) / 1.055).powf(2.4) }) as f32
}

// ----- running lookups -----

/// Components a kernel stores: `_f1` one float, `_uc4` four bytes, the others four 32-bit values.
fn components(kernel: &str) -> (usize, usize) {
    if kernel.ends_with("_f1") {
        (1, 4)
    } else if kernel.ends_with("_uc4") {
        (4, 1)
    } else {
        (4, 4)
    }
}

/// Runs `kernel` on `coords` with texture handle 7 and returns each lookup's components (bytes widened).
fn run_lookups(m: &Loaded, kernel: &str, tex: Texture, coords: &[Coord], bufs: &[&Buf]) -> Vec<[u32; 4]> {
    tex.validate().unwrap_or_else(|e| panic!("{kernel}: {e}"));
    let mut table = ResourceTable::default();
    table.textures.insert(7, Arc::new(tex));
    let n = coords.len();
    let (count, size) = components(kernel);
    let (bc, bo) = (Buf::from(coords), Buf::zeroed(n * count * size));
    let args = Args::default().p(7u64).buf(&bc).buf(&bo).p(n as i32);
    let mut all = bufs.to_vec();
    all.extend([&bc, &bo]);
    m.run_with(kernel, (n as u32).div_ceil(64), 64, &args, &all, &table)
        .unwrap_or_else(|e| panic!("{}: {kernel}: {e}", m.name));
    let bytes = bo.bytes();
    (0..n)
        .map(|i| {
            std::array::from_fn(|k| {
                if k >= count {
                    return 0;
                }
                let o = (i * count + k) * size;
                let mut b = [0u8; 4];
                b[..size].copy_from_slice(&bytes[o..o + size]);
                u32::from_le_bytes(b)
            })
        })
        .collect()
}

/// Runs the lookups and compares them with `expected`, component by component, bit for bit.
fn check(
    m: &Loaded,
    kernel: &str,
    what: &str,
    tex: Texture,
    coords: &[Coord],
    bufs: &[&Buf],
    expected: impl Fn(&Coord) -> [u32; 4],
) {
    let got = run_lookups(m, kernel, tex, coords, bufs);
    let (count, size) = components(kernel);
    let mask = if size == 1 { 0xff } else { u32::MAX };
    let mut wrong = Vec::new();
    for (c, g) in coords.iter().zip(&got) {
        let e = expected(c);
        if (0..count).any(|k| g[k] != e[k] & mask) {
            let show = |v: &[u32; 4]| {
                v[..count].iter().map(|x| format!("{x:#x} ({})", f32::from_bits(*x))).collect::<Vec<_>>().join(", ")
            };
            wrong.push(format!("  {c:?}\n    got      {}\n    expected {}", show(g), show(&e)));
        }
    }
    assert!(
        wrong.is_empty(),
        "{}: {kernel} ({what}): {} of {} lookups differ:\n{}",
        m.name,
        wrong.len(),
        coords.len(),
        wrong[..wrong.len().min(12)].join("\n")
    );
}

fn grid(xs: &[f32], ys: &[f32]) -> Vec<Coord> {
    xs.iter().flat_map(|&x| ys.iter().map(move |&y| at(x, y))).collect()
}

const MODES: [AddressMode; 4] = [AddressMode::Wrap, AddressMode::Clamp, AddressMode::Mirror, AddressMode::Border];
const UNNORMALIZED: &[f32] =
    &[-3.5, -0.5, -0.25, 0.0, 0.25, 0.5, 0.7, 1.0, 1.6, 2.5, 3.999, 4.0, 4.5, 4.75, 5.0, 5.5, 7.25, 100.0, f32::NAN];
const NORMALIZED: &[f32] = &[
    -1.3,
    -0.5,
    -0.1,
    0.0,
    0.03125,
    0.1,
    1.0 / 3.0,
    0.5,
    0.77,
    0.999,
    1.0,
    1.1,
    1.25,
    1.5,
    2.6,
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
];

// ----- tests -----

/// Linear filtering's 8-bit weights, against results a GPU returned (NVIDIA developer forum, "tex1D accuracy"): a
/// two-texel float texture {1, 2}, normalized coordinates, sampled at 0, 0.05, ..., 0.95.
#[test]
fn linear_filtering_matches_published_gpu_results() {
    // The printed results, in 256ths: 1.1015625 is 282/256.
    let gpu: Vec<f32> =
        [256, 256, 256, 256, 256, 256, 282, 307, 333, 358, 384, 410, 435, 461, 486, 512, 512, 512, 512, 512]
            .map(|x| x as f32 / 256.0)
            .to_vec();
    for v in variants("textures.cu", &[70], false) {
        let m = Loaded::new(&v.ptx, &v.label);
        let img = TestImage::new(fmt(ChannelType::F32, 1), ArrayKind::D1, [2, 1, 1], 1, 1, |_, _, x, _, _, _| {
            (1.0 + x as f32).to_bits()
        });
        let d = desc([AddressMode::Clamp; 3], FilterMode::Linear, ReadMode::ElementType, true);
        let coords: Vec<Coord> = (0..20).map(|i| at(i as f32 * 0.05, 0.0)).collect();
        let got = run_lookups(
            &m,
            "tex1d_f4",
            Texture { resource: Resource::Array(img.desc()), desc: d },
            &coords,
            &img.bufs(),
        );
        let got: Vec<f32> = got.iter().map(|g| f32::from_bits(g[0])).collect();
        assert_eq!(got, gpu, "{}", v.label);
    }
}

/// 2D float textures under every addressing mode on each axis, both filters, normalized and unnormalized
/// coordinates, at and beyond the edges, negative, NaN and infinite coordinates.
#[test]
fn addressing_and_filtering_2d() {
    for v in variants("textures.cu", &[70], true) {
        let m = Loaded::new(&v.ptx, &v.label);
        let img = TestImage::new(fmt(ChannelType::F32, 4), ArrayKind::D2, [5, 3, 1], 1, 1, |_, _, x, y, _, ch| {
            let (x, y) = (x as f32, y as f32);
            [x + 10.0 * y, -(x + y) / 4.0, 100.0 + x * y, 0.5f32.powi(x as i32) - y][ch as usize].to_bits()
        });
        for (mx, my) in [(0, 1), (1, 0), (2, 3), (3, 2), (0, 2), (3, 3)] {
            for filter in [FilterMode::Point, FilterMode::Linear] {
                for normalized in [false, true] {
                    let d = desc([MODES[mx], MODES[my], AddressMode::Clamp], filter, ReadMode::ElementType, normalized);
                    let list = if normalized { NORMALIZED } else { UNNORMALIZED };
                    let coords = grid(list, &list[..list.len().min(12)]);
                    let r = Ref { img: &img, d, mipmapped: false };
                    let tex = Texture { resource: Resource::Array(img.desc()), desc: d };
                    let what = format!("{:?}/{:?} {filter:?} normalized={normalized}", MODES[mx], MODES[my]);
                    check(&m, "tex2d_f4", &what, tex, &coords, &img.bufs(), |c| r.sample(G::D2, c));
                }
            }
        }
        // tex2D<float> reads the first component of the same lookup.
        let d = desc([AddressMode::Clamp; 3], FilterMode::Linear, ReadMode::ElementType, false);
        let r = Ref { img: &img, d, mipmapped: false };
        let tex = Texture { resource: Resource::Array(img.desc()), desc: d };
        check(&m, "tex2d_f1", "scalar", tex, &grid(UNNORMALIZED, UNNORMALIZED), &img.bufs(), |c| r.sample(G::D2, c));
    }
}

/// Normalized-float reads of 8- and 16-bit integers (filtered and not), element-type reads of every integer size,
/// half floats, sRGB, a one-texel texture, and the border colour of textures returning integers.
#[test]
fn formats_and_read_modes() {
    let raw8 = [0u32, 255, 128, 1, 127, 200, 64, 33];
    let raw16 = [0u32, 0xffff, 0x8000, 1, 0x7fff, 12345, 0x8001, 40000];
    let half = [0x3c00u32, 0xc000, 0x3555, 0x7bff, 0x0001, 0x8000, 0x4248, 0x3800];
    let coords = grid(&[-1.0, 0.0, 0.4, 0.5, 1.25, 2.0, 2.7, 3.5, 4.0, 9.0], &[-0.5, 0.5, 1.0, 1.5, 2.9, 3.5, 6.0]);
    for v in variants("textures.cu", &[70], true) {
        let m = Loaded::new(&v.ptx, &v.label);
        let pick = |vals: &[u32; 8]| {
            let vals = *vals;
            move |_: u32, _: u32, x: u32, y: u32, _: u32, ch: u32| vals[((x * 3 + y * 5 + ch * 7) % 8) as usize]
        };
        let cases: Vec<(ChannelType, u8, &[u32; 8])> = vec![
            (ChannelType::U8, 4, &raw8),
            (ChannelType::S8, 1, &raw8),
            (ChannelType::U16, 2, &raw16),
            (ChannelType::S16, 4, &raw16),
            (ChannelType::F16, 2, &half),
            (ChannelType::S8, 2, &raw8),
        ];
        for (ty, ch, vals) in cases {
            let img = TestImage::new(fmt(ty, ch), ArrayKind::D2, [4, 4, 1], 1, 1, pick(vals));
            for filter in [FilterMode::Point, FilterMode::Linear] {
                for mode in [AddressMode::Clamp, AddressMode::Border] {
                    let read = if ty.is_float() { ReadMode::ElementType } else { ReadMode::NormalizedFloat };
                    let d = desc([mode; 3], filter, read, false);
                    let r = Ref { img: &img, d, mipmapped: false };
                    let tex = Texture { resource: Resource::Array(img.desc()), desc: d };
                    let what = format!("{ty:?}x{ch} {read:?} {filter:?} {mode:?}");
                    check(&m, "tex2d_f4", &what, tex, &coords, &img.bufs(), |c| r.sample(G::D2, c));
                }
            }
        }
        // sRGB: R, G and B are converted, alpha is not.
        let img = TestImage::new(fmt(ChannelType::U8, 4), ArrayKind::D2, [4, 4, 1], 1, 1, pick(&raw8));
        let d = TextureDesc {
            srgb: true,
            ..desc([AddressMode::Clamp; 3], FilterMode::Linear, ReadMode::NormalizedFloat, false)
        };
        let r = Ref { img: &img, d, mipmapped: false };
        let tex = Texture { resource: Resource::Array(img.desc()), desc: d };
        check(&m, "tex2d_f4", "sRGB", tex, &coords, &img.bufs(), |c| r.sample(G::D2, c));
        // Element-type reads: integers sign- or zero-extended; the border colour's bits for textures of integers.
        let ints: Vec<(ChannelType, u8, &[u32; 8], &str)> = vec![
            (ChannelType::U8, 4, &raw8, "tex2d_u4"),
            (ChannelType::U8, 4, &raw8, "tex2d_uc4"),
            (ChannelType::S8, 2, &raw8, "tex2d_i4"),
            (ChannelType::S16, 2, &raw16, "tex2d_i4"),
            (ChannelType::U16, 1, &raw16, "tex2d_u4"),
        ];
        for (ty, ch, vals, kernel) in ints {
            let img = TestImage::new(fmt(ty, ch), ArrayKind::D2, [4, 4, 1], 1, 1, pick(vals));
            for mode in MODES {
                let d = desc([mode; 3], FilterMode::Point, ReadMode::ElementType, true);
                let r = Ref { img: &img, d, mipmapped: false };
                let tex = Texture { resource: Resource::Array(img.desc()), desc: d };
                let what = format!("{ty:?}x{ch} {mode:?}");
                check(&m, kernel, &what, tex, &grid(NORMALIZED, &[0.1, 0.6, 1.2, -0.3]), &img.bufs(), |c| {
                    r.sample(G::D2, c)
                });
            }
        }
        let img = TestImage::new(fmt(ChannelType::S32, 1), ArrayKind::D2, [3, 2, 1], 1, 1, |_, _, x, y, _, _| {
            (x as i32 * 1000 - y as i32 * 77 - 5) as u32
        });
        let d = desc([AddressMode::Border; 3], FilterMode::Point, ReadMode::ElementType, false);
        let r = Ref { img: &img, d, mipmapped: false };
        let tex = Texture { resource: Resource::Array(img.desc()), desc: d };
        check(&m, "tex2d_i4", "S32 border", tex, &coords, &img.bufs(), |c| r.sample(G::D2, c));
        // A one-texel texture under every mode and filter.
        let img = TestImage::new(fmt(ChannelType::F32, 4), ArrayKind::D2, [1, 1, 1], 1, 1, |_, _, _, _, _, ch| {
            [3.0f32, -1.0, 0.125, 9.0][ch as usize].to_bits()
        });
        for mode in MODES {
            for filter in [FilterMode::Point, FilterMode::Linear] {
                for normalized in [false, true] {
                    let d = desc([mode; 3], filter, ReadMode::ElementType, normalized);
                    let r = Ref { img: &img, d, mipmapped: false };
                    let tex = Texture { resource: Resource::Array(img.desc()), desc: d };
                    let list = if normalized { NORMALIZED } else { UNNORMALIZED };
                    let what = format!("1x1 {mode:?} {filter:?} normalized={normalized}");
                    check(&m, "tex2d_f4", &what, tex, &grid(list, &[0.0, 0.5, -0.7, 1.5]), &img.bufs(), |c| {
                        r.sample(G::D2, c)
                    });
                }
            }
        }
    }
}

/// 1D and 3D textures, and layered 1D and 2D textures (layer indices out of range clamp to the last layer).
#[test]
fn one_three_dimensional_and_layered() {
    for v in variants("textures.cu", &[70], true) {
        let m = Loaded::new(&v.ptx, &v.label);
        let val = |l: u32, x: u32, y: u32, z: u32, ch: u32| {
            (l as f32 * 1000.0 + x as f32 + y as f32 * 10.0 + z as f32 * 100.0 + ch as f32 * 0.25).to_bits()
        };
        let img1 = TestImage::new(fmt(ChannelType::F32, 4), ArrayKind::D1, [6, 1, 1], 1, 1, |_, l, x, y, z, c| {
            val(l, x, y, z, c)
        });
        let img3 = TestImage::new(fmt(ChannelType::F32, 2), ArrayKind::D3, [4, 3, 5], 1, 1, |_, l, x, y, z, c| {
            val(l, x, y, z, c)
        });
        let l1 = TestImage::new(fmt(ChannelType::F32, 4), ArrayKind::Layered1D, [6, 1, 1], 3, 1, |_, l, x, y, z, c| {
            val(l, x, y, z, c)
        });
        let l2 = TestImage::new(fmt(ChannelType::F32, 1), ArrayKind::Layered2D, [4, 3, 1], 4, 1, |_, l, x, y, z, c| {
            val(l, x, y, z, c)
        });
        let xs = [-1.0, 0.0, 0.3, 0.5, 1.7, 3.5, 5.5, 6.0, 8.25];
        for filter in [FilterMode::Point, FilterMode::Linear] {
            for mode in MODES {
                for normalized in [false, true] {
                    let d = desc(
                        [mode, AddressMode::Clamp, AddressMode::Border],
                        filter,
                        ReadMode::ElementType,
                        normalized,
                    );
                    let scale = |x: f32| if normalized { x / 4.0 } else { x };
                    let what = format!("{mode:?} {filter:?} normalized={normalized}");
                    // 1D
                    let coords: Vec<Coord> = xs.iter().map(|&x| at(scale(x), 0.0)).collect();
                    let r = Ref { img: &img1, d, mipmapped: false };
                    let tex = Texture { resource: Resource::Array(img1.desc()), desc: d };
                    check(&m, "tex1d_f4", &what, tex, &coords, &img1.bufs(), |c| r.sample(G::D1, c));
                    // 3D
                    let mut coords = Vec::new();
                    for &x in &xs {
                        for (y, z) in [(0.5, 0.5), (1.2, 4.9), (-0.4, 2.5), (3.0, 5.5), (2.75, -1.0)] {
                            coords.push(Coord { z: scale(z), ..at(scale(x), scale(y)) });
                        }
                    }
                    let r = Ref { img: &img3, d, mipmapped: false };
                    let tex = Texture { resource: Resource::Array(img3.desc()), desc: d };
                    check(&m, "tex3d_f4", &what, tex, &coords, &img3.bufs(), |c| r.sample(G::D3, c));
                    // Layered
                    let mut coords = Vec::new();
                    for &x in &xs {
                        for layer in [-1, 0, 1, 2, 3, 7] {
                            coords.push(Coord { layer, ..at(scale(x), scale(1.3)) });
                        }
                    }
                    let r = Ref { img: &l1, d, mipmapped: false };
                    let tex = Texture { resource: Resource::Array(l1.desc()), desc: d };
                    check(&m, "tex1d_layered_f4", &what, tex, &coords, &l1.bufs(), |c| r.sample(G::L1, c));
                    let r = Ref { img: &l2, d, mipmapped: false };
                    let tex = Texture { resource: Resource::Array(l2.desc()), desc: d };
                    check(&m, "tex2d_layered_f4", &what, tex, &coords, &l2.bufs(), |c| r.sample(G::L2, c));
                }
            }
        }
    }
}

/// Cubemaps and layered cubemaps: the face the major axis selects, and the face coordinates.
#[test]
fn cubemaps() {
    for v in variants("textures.cu", &[70], true) {
        let m = Loaded::new(&v.ptx, &v.label);
        let val = |l: u32, x: u32, y: u32| (l as f32 * 100.0 + y as f32 * 10.0 + x as f32).to_bits();
        let cube1 =
            TestImage::new(fmt(ChannelType::F32, 1), ArrayKind::Cubemap, [4, 4, 1], 6, 1, |_, l, x, y, _, _| {
                val(l, x, y)
            });
        let cubes = TestImage::new(
            fmt(ChannelType::F32, 2),
            ArrayKind::LayeredCubemap,
            [4, 4, 1],
            12,
            1,
            |_, l, x, y, _, c| val(l, x, y) + c,
        );
        let mut dirs = Vec::new();
        let mut seed = 0x1234_5678_9abc_def0u64;
        for major in 0..6 {
            for _ in 0..12 {
                let mut r = || (xorshift(&mut seed) % 2001) as f32 / 1000.0 - 1.0;
                let mut d = [r() * 0.9, r() * 0.9, r() * 0.9];
                d[major / 2] = if major % 2 == 0 { 1.0 + r().abs() } else { -1.0 - r().abs() };
                dirs.push(d);
            }
            let mut d = [0.25, -0.5, 0.125];
            d[major / 2] = if major % 2 == 0 { 1.0 } else { -1.0 };
            dirs.push(d);
        }
        for filter in [FilterMode::Point, FilterMode::Linear] {
            for mode in [AddressMode::Clamp, AddressMode::Border] {
                let d = desc([mode; 3], filter, ReadMode::ElementType, true);
                let what = format!("{mode:?} {filter:?}");
                let coords: Vec<Coord> = dirs.iter().map(|d| Coord { z: d[2], ..at(d[0], d[1]) }).collect();
                let r = Ref { img: &cube1, d, mipmapped: false };
                let tex = Texture { resource: Resource::Array(cube1.desc()), desc: d };
                check(&m, "cube_f4", &what, tex, &coords, &cube1.bufs(), |c| r.sample(G::Cube, c));
                let coords: Vec<Coord> = dirs
                    .iter()
                    .enumerate()
                    .map(|(i, d)| Coord { z: d[2], layer: [0, 1, 5][i % 3], ..at(d[0], d[1]) })
                    .collect();
                let r = Ref { img: &cubes, d, mipmapped: false };
                let tex = Texture { resource: Resource::Array(cubes.desc()), desc: d };
                check(&m, "cube_layered_f4", &what, tex, &coords, &cubes.bufs(), |c| r.sample(G::LCube, c));
            }
        }
    }
}

/// Mipmapped textures: `tex2DLod` under point and linear mipmap filtering with a bias and level clamps, and
/// `tex2DGrad` choosing the level from the derivatives.
#[test]
fn mipmaps() {
    for v in variants("textures.cu", &[70], false) {
        let m = Loaded::new(&v.ptx, &v.label);
        let img = TestImage::new(fmt(ChannelType::F32, 4), ArrayKind::D2, [8, 8, 1], 1, 4, |lv, _, x, y, _, ch| {
            (lv as f32 * 1000.0 + y as f32 * 10.0 + x as f32 + ch as f32 * 0.5).to_bits()
        });
        let lods = [-1.0, 0.0, 0.25, 0.5, 0.51, 1.0, 1.3, 2.75, 3.0, 9.0];
        let mut coords = Vec::new();
        for &lod in &lods {
            for (x, y) in [(0.1, 0.2), (0.5, 0.5), (0.93, 0.31), (0.0, 1.0)] {
                coords.push(Coord { lod, ..at(x, y) });
            }
        }
        for (filter, mip) in [
            (FilterMode::Point, FilterMode::Point),
            (FilterMode::Linear, FilterMode::Linear),
            (FilterMode::Point, FilterMode::Linear),
        ] {
            for (bias, lo, hi) in [(0.0, 0.0, 3.0), (0.5, 0.0, 3.0), (0.0, 1.0, 2.0), (0.0, 0.0, 0.0)] {
                let d = TextureDesc {
                    mipmap_filter: mip,
                    mipmap_level_bias: bias,
                    min_mipmap_level_clamp: lo,
                    max_mipmap_level_clamp: hi,
                    ..desc([AddressMode::Wrap; 3], filter, ReadMode::ElementType, true)
                };
                let r = Ref { img: &img, d, mipmapped: true };
                let tex = Texture { resource: Resource::Mipmapped(img.desc()), desc: d };
                let what = format!("{filter:?} mip {mip:?} bias {bias} clamp [{lo}, {hi}]");
                check(&m, "lod2d_f4", &what, tex, &coords, &img.bufs(), |c| r.sample(G::D2, c));
            }
        }
        // Gradients of 2^k texels select level k: lod = log2(max(|dPdx|, |dPdy|) in texels).
        let d = TextureDesc {
            mipmap_filter: FilterMode::Linear,
            max_mipmap_level_clamp: 3.0,
            ..desc([AddressMode::Clamp; 3], FilterMode::Point, ReadMode::ElementType, true)
        };
        let r = Ref { img: &img, d, mipmapped: true };
        let mut coords = Vec::new();
        for (dx, dy, lod) in [
            ([0.125, 0.0], [0.0, 0.125], 0.0),
            ([0.25, 0.0], [0.0, 0.0], 1.0),
            ([0.0, 0.0], [0.0, 0.5], 2.0),
            ([1.0, 0.0], [0.0, 0.0], 3.0),
            ([0.0, 0.0], [0.0, 0.0], 0.0),
        ] {
            coords.push(Coord { dx, dy, lod, ..at(0.3, 0.6) });
        }
        let tex = Texture { resource: Resource::Mipmapped(img.desc()), desc: d };
        check(&m, "grad2d_f4", "gradients", tex, &coords, &img.bufs(), |c| r.sample(G::D2, c));
    }
}

/// `tex2Dgather`: one component of the 2x2 footprint, counter-clockwise from the lower left.
#[test]
fn gather() {
    for v in variants("textures.cu", &[70], true) {
        let m = Loaded::new(&v.ptx, &v.label);
        let img = TestImage::new(fmt(ChannelType::U8, 4), ArrayKind::D2, [4, 3, 1], 1, 1, |_, _, x, y, _, ch| {
            x * 16 + y * 4 + ch * 64
        });
        let mut coords = Vec::new();
        for &x in &[-0.2, 0.0, 0.26, 0.5, 0.9, 1.0, 1.3] {
            for &y in &[-0.5, 0.1, 0.5, 0.8, 1.2] {
                for comp in 0..4 {
                    coords.push(Coord { comp, ..at(x, y) });
                }
            }
        }
        for (read, kernel) in [(ReadMode::NormalizedFloat, "gather_f4"), (ReadMode::ElementType, "gather_i4")] {
            for mode in MODES {
                let d = desc([mode; 3], FilterMode::Point, read, true);
                let r = Ref { img: &img, d, mipmapped: false };
                let tex = Texture { resource: Resource::Array(img.desc()), desc: d };
                check(&m, kernel, &format!("{mode:?}"), tex, &coords, &img.bufs(), |c| r.gather(c));
            }
        }
    }
}

/// `tex1Dfetch` on linear memory (integer indices, no filtering, zero outside), and `tex2D` on pitched memory.
#[test]
fn linear_and_pitched_memory() {
    for v in variants("textures.cu", &[70], true) {
        let m = Loaded::new(&v.ptx, &v.label);
        let n = 37usize;
        let idx = [-5, -1, 0, 1, 17, 36, 37, 40, 100000];
        let coords: Vec<Coord> = idx.iter().map(|&i| at(i as f32, 0.0)).collect();
        // float4 elements
        let vals: Vec<[f32; 4]> = (0..n).map(|i| [i as f32, -(i as f32), 0.5 * i as f32, 1e6]).collect();
        let buf = Buf::from(&vals);
        let format = fmt(ChannelType::F32, 4);
        let tex = Texture {
            resource: Resource::Linear { base: buf.addr(), format, size: (n * 16) as u64 },
            desc: desc([AddressMode::Wrap; 3], FilterMode::Point, ReadMode::ElementType, false),
        };
        check(&m, "fetch_f4", "float4", tex, &coords, &[&buf], |c| {
            let i = c.x as i64;
            if (0..n as i64).contains(&i) { vals[i as usize].map(f32::to_bits) } else { [0; 4] }
        });
        // short2 elements read as int4
        let shorts: Vec<[i16; 2]> = (0..n).map(|i| [i as i16 * -300, 7 - i as i16]).collect();
        let buf = Buf::from(&shorts);
        let tex = Texture {
            resource: Resource::Linear { base: buf.addr(), format: fmt(ChannelType::S16, 2), size: (n * 4) as u64 },
            desc: desc([AddressMode::Wrap; 3], FilterMode::Point, ReadMode::ElementType, false),
        };
        check(&m, "fetch_i4", "short2", tex, &coords, &[&buf], |c| {
            let i = c.x as i64;
            if (0..n as i64).contains(&i) {
                let s = shorts[i as usize];
                [s[0] as i32 as u32, s[1] as i32 as u32, 0, 1]
            } else {
                [0; 4]
            }
        });
        // unsigned char read as normalized float
        let bytes: Vec<u8> = (0..n).map(|i| (i * 7) as u8).collect();
        let buf = Buf::from(&bytes);
        let tex = Texture {
            resource: Resource::Linear { base: buf.addr(), format: fmt(ChannelType::U8, 1), size: n as u64 },
            desc: desc([AddressMode::Wrap; 3], FilterMode::Point, ReadMode::NormalizedFloat, false),
        };
        check(&m, "fetch_f1", "uchar normalized", tex, &coords, &[&buf], |c| {
            let i = c.x as i64;
            let v = if (0..n as i64).contains(&i) { bytes[i as usize] as f32 / 255.0 } else { 0.0 };
            [v.to_bits(), 0, 0, 0]
        });
        // Pitched 2D memory: 6x4 floats with rows 64 bytes apart, filtered.
        let pitch = 64usize;
        let mut raw = vec![0f32; pitch / 4 * 4];
        for y in 0..4 {
            for x in 0..6 {
                raw[y * pitch / 4 + x] = (x * x) as f32 + y as f32 * 0.5;
            }
        }
        let buf = Buf::from(&raw);
        let img = TestImage {
            format: fmt(ChannelType::F32, 1),
            kind: ArrayKind::D2,
            layers: 1,
            levels: vec![(
                Buf::from(&raw),
                Level {
                    base: 0,
                    width: 6,
                    height: 4,
                    depth: 1,
                    row_pitch: pitch as u64,
                    slice_pitch: 4 * pitch as u64,
                },
            )],
        };
        for filter in [FilterMode::Point, FilterMode::Linear] {
            let d = desc(
                [AddressMode::Border, AddressMode::Clamp, AddressMode::Clamp],
                filter,
                ReadMode::ElementType,
                false,
            );
            let r = Ref { img: &img, d, mipmapped: false };
            let tex = Texture {
                resource: Resource::Pitch2D {
                    base: buf.addr(),
                    format: img.format,
                    width: 6,
                    height: 4,
                    pitch: pitch as u64,
                },
                desc: d,
            };
            check(
                &m,
                "tex2d_f1",
                &format!("pitch2D {filter:?}"),
                tex,
                &grid(UNNORMALIZED, &[0.0, 0.5, 1.75, 3.5, 9.0]),
                &[&buf],
                |c| r.sample(G::D2, c),
            );
        }
    }
}

/// `txq` answers, and a lookup through a handle that is not a texture object.
#[test]
fn queries_and_invalid_handles() {
    for v in variants("textures.cu", &[70], false) {
        let m = Loaded::new(&v.ptx, &v.label);
        let img = TestImage::new(fmt(ChannelType::U16, 2), ArrayKind::Layered2D, [9, 5, 1], 3, 2, |_, _, _, _, _, _| 0);
        let d = TextureDesc {
            address: [AddressMode::Mirror, AddressMode::Border, AddressMode::Clamp],
            filter: FilterMode::Linear,
            read: ReadMode::NormalizedFloat,
            normalized_coords: true,
            max_mipmap_level_clamp: 1.0,
            ..TextureDesc::default()
        };
        let mut table = ResourceTable::default();
        table.textures.insert(3, Arc::new(Texture { resource: Resource::Mipmapped(img.desc()), desc: d }));
        let out = Buf::zeroed(12 * 4);
        let mut bufs = img.bufs();
        bufs.push(&out);
        m.run_with("texture_queries", 1, 1, &Args::default().p(3u64).buf(&out), &bufs, &table).unwrap();
        // width, height, depth, array size, levels, normalized, filter, address modes 0 and 1 (PTX's enumeration:
        // wrap, mirror, clamp_ogl, clamp_to_edge, clamp_to_border), channel type (OpenCL's CL_UNORM_INT16) and
        // order (CL_RG), width of level 1.
        assert_eq!(out.get::<u32>(), vec![9, 5, 1, 3, 2, 1, 1, 1, 4, 0x10D3, 0x10B2, 4], "{}", v.label);
        // An unknown handle is an illegal address, as on a GPU, and names the handle.
        let coords = Buf::from(&[at(0.0, 0.0)]);
        let out = Buf::zeroed(16);
        let args = Args::default().p(0xdeadu64).buf(&coords).buf(&out).p(1i32);
        let e = m.run_with("tex2d_f4", 1, 32, &args, &[&coords, &out], &table).unwrap_err();
        assert!(matches!(e, ExecError::InvalidHandle { handle: 0xdead, surface: false, .. }), "{e}");
        assert_eq!(e.cuda_error(), 700);
        assert!(e.to_string().contains("0xdead is not a texture object"), "{e}");
    }
}

/// Descriptors `cudaCreateTextureObject` refuses are refused by `validate`.
#[test]
fn invalid_descriptors_are_refused() {
    let img = TestImage::new(fmt(ChannelType::S32, 1), ArrayKind::D2, [2, 2, 1], 1, 1, |_, _, _, _, _, _| 0);
    let d = desc([AddressMode::Clamp; 3], FilterMode::Linear, ReadMode::ElementType, false);
    let linear_int = Texture { resource: Resource::Array(img.desc()), desc: d };
    assert!(linear_int.validate().is_err(), "linear filtering of integers");
    let d = desc([AddressMode::Clamp; 3], FilterMode::Point, ReadMode::NormalizedFloat, false);
    let norm32 = Texture { resource: Resource::Array(img.desc()), desc: d };
    assert!(norm32.validate().is_err(), "normalized reads of 32-bit integers");
    let mut bad = img.desc();
    bad.levels[0].row_pitch = 4;
    assert!(bad.validate().is_err(), "a pitch below the row");
    assert_eq!(ChannelFormat::from_cuda(8, 8, 8, 0, 1).unwrap_err().cuda_error(), 20, "three channels");
    assert_eq!(ChannelFormat::from_cuda(16, 16, 0, 0, 2), Ok(fmt(ChannelType::F16, 2)));
    assert_eq!(ChannelFormat::from_driver(0x08, 4), Ok(fmt(ChannelType::S8, 4)));
    let mut cube = img.desc();
    cube.kind = ArrayKind::Cubemap;
    assert!(cube.validate().is_err(), "a cubemap with one face");
}

/// The layouts a backend gets for `cudaMalloc3DArray`'s and `cudaMallocMipmappedArray`'s extents and flags.
#[test]
fn arrays_from_cuda_extents() {
    let f = fmt(ChannelType::F32, 2);
    let make = |extent: [u64; 3], flags: u32, levels: u32| ArrayDesc::from_cuda(f, extent, flags, levels, 0x1000);
    let shape =
        |a: &ArrayDesc| (a.kind, a.layers, a.levels.iter().map(|l| [l.width, l.height, l.depth]).collect::<Vec<_>>());
    // extent, flags, levels asked for; the kind, layers, level extents and bytes expected.
    type Case = ([u64; 3], u32, u32, ArrayKind, u32, Vec<[u32; 3]>, u64);
    let cases: Vec<Case> = vec![
        ([10, 0, 0], 0, 1, ArrayKind::D1, 1, vec![[10, 1, 1]], 80),
        ([10, 3, 0], 0, 1, ArrayKind::D2, 1, vec![[10, 3, 1]], 240),
        ([4, 3, 5], 0, 1, ArrayKind::D3, 1, vec![[4, 3, 5]], 480),
        ([7, 0, 3], 1, 1, ArrayKind::Layered1D, 3, vec![[7, 1, 1]], 176),
        ([7, 2, 3], 1, 1, ArrayKind::Layered2D, 3, vec![[7, 2, 1]], 336),
        ([4, 4, 6], 4, 1, ArrayKind::Cubemap, 6, vec![[4, 4, 1]], 768),
        ([2, 2, 12], 5, 1, ArrayKind::LayeredCubemap, 12, vec![[2, 2, 1]], 384),
        // Mipmaps: levels halve (at least 1), 16-byte aligned; too many levels are clamped to the chain's length.
        ([8, 2, 0], 0, 9, ArrayKind::D2, 1, vec![[8, 2, 1], [4, 1, 1], [2, 1, 1], [1, 1, 1]], 128 + 32 + 16 + 16),
        ([3, 0, 0], 2, 0, ArrayKind::D1, 1, vec![[3, 1, 1]], 32),
    ];
    for (extent, flags, levels, kind, layers, dims, bytes) in cases {
        let (a, size) = make(extent, flags, levels).unwrap_or_else(|e| panic!("{extent:?} {flags}: {e}"));
        assert_eq!(shape(&a), (kind, layers, dims), "{extent:?} flags {flags}");
        assert_eq!(size, bytes, "{extent:?} flags {flags}");
        assert_eq!(a.levels[0].base, 0x1000);
        a.validate().unwrap_or_else(|e| panic!("{extent:?}: {e}"));
    }
    for (extent, flags) in [([0, 0, 0], 0), ([4, 3, 6], 4), ([4, 4, 7], 5), ([4, 0, 0], 1), ([1 << 40, 1, 0], 0)] {
        assert!(make(extent, flags, 1).is_err(), "{extent:?} flags {flags} was accepted");
    }
}

/// A module using texture references (removed in CUDA 12) is refused with a clear message when a kernel uses one,
/// and so are the texture forms the interpreter does not implement.
#[test]
fn unsupported_texture_forms_are_refused() {
    let header = ".version 7.8\n.target sm_80\n.address_size 64\n.global .texref oldtex;\n.global .samplerref smp;\n";
    let body = |name: &str, inst: &str| {
        format!(
            ".visible .entry {name}(.param .u64 t)\n{{\n.reg .f32 %f<8>;\n.reg .b32 %r<8>;\n.reg .b64 %rd<4>;\n\
             ld.param.u64 %rd1, [t];\nmov.f32 %f1, 0f00000000;\nmov.b32 %r1, 0;\n{inst}\nret;\n}}\n"
        )
    };
    let cases = [
        (
            "texref",
            "tex.2d.v4.f32.f32 {%f2, %f3, %f4, %f5}, [oldtex, {%f1, %f1}];",
            "`oldtex` is a texture reference (.texref)",
        ),
        ("sampler", "tex.2d.v4.f32.f32 {%f2, %f3, %f4, %f5}, [%rd1, smp, {%f1, %f1}];", "independent texturing mode"),
        ("offset", "tex.2d.v4.f32.f32 {%f2, %f3, %f4, %f5}, [%rd1, {%f1, %f1}], {%r1, %r1};", "offsets"),
        ("compare", "tex.2d.v4.f32.f32 {%f2, %f3, %f4, %f5}, [%rd1, {%f1, %f1}], %f1;", "depth comparison"),
        ("half", "tex.2d.v2.f16x2.f32 {%r2, %r3}, [%rd1, {%f1, %f1}];", "four-component"),
        ("multisample", "tex.2dms.v4.s32.s32 {%r2, %r3, %r4, %r5}, [%rd1, {%r1, %r1, %r1, %r1}];", "tex.2dms"),
        ("reduction", "sured.b.add.2d.u32.trap [%rd1, {%r1, %r1}], %r1;", "sured"),
    ];
    let mut ptx = header.to_string();
    ptx += ".visible .entry plain(.param .u64 out)\n{\nret;\n}\n";
    for (name, inst, _) in &cases {
        ptx += &body(name, inst);
    }
    let prog = phos_ptx::exec::Program::new(&phos_ptx::parse(&ptx).unwrap_or_else(|e| panic!("{e}\n{ptx}")));
    for (name, _, why) in cases {
        let e = prog.kernel(name).unwrap().error.unwrap_or_else(|| panic!("{name} was accepted"));
        assert!(e.to_string().contains(why), "{name}: {e}");
        assert_eq!(e.cuda_error(), 801, "{name}");
    }
    assert!(prog.kernel("plain").unwrap().error.is_none());
    assert!(prog.variables().is_empty(), "references have no storage: {:?}", prog.variables());
}

// ----- surfaces.cu -----

/// A surface over a test image, as handle `h` in `table`.
fn surface(table: &mut ResourceTable, h: u64, img: &TestImage) {
    let array = img.desc();
    array.validate().unwrap();
    table.surfaces.insert(h, Arc::new(Surface { array }));
}

/// Texel (x, y, z) of `layer` as raw channels.
fn texel_of(img: &TestImage, layer: u32, x: u32, y: u32, z: u32) -> [u32; 4] {
    img.raw(0, layer, x, y, z)
}

/// surf2Dread/surf2Dwrite and the other forms, with each boundary mode, on every kind of array.
#[test]
fn surfaces_read_and_write() {
    for v in variants("surfaces.cu", &[70], true) {
        let m = Loaded::new(&v.ptx, &v.label);
        let mut table = ResourceTable::default();
        // 2D floats, doubled from one surface into another.
        let (w, h) = (7u32, 5u32);
        let src = TestImage::new(fmt(ChannelType::F32, 1), ArrayKind::D2, [w, h, 1], 1, 1, |_, _, x, y, _, _| {
            (x as f32 * 0.5 - y as f32).to_bits()
        });
        let dst = TestImage::new(fmt(ChannelType::F32, 1), ArrayKind::D2, [w, h, 1], 1, 1, |_, _, _, _, _, _| 0);
        surface(&mut table, 1, &src);
        surface(&mut table, 2, &dst);
        let mut bufs = src.bufs();
        bufs.extend(dst.bufs());
        let launch = Loaded::run_with;
        launch(&m, "scale2d", 1, 64, &Args::default().p(1u64).p(2u64).p(w as i32).p(h as i32), &bufs, &table)
            .unwrap_or_else(|e| panic!("{}: {e}", v.label));
        // One block row only: y = blockIdx.y is 0, so only row 0 is written.
        for x in 0..w {
            for y in 0..h {
                let want = if y == 0 { f32::from_bits(texel_of(&src, 0, x, y, 0)[0]) * 2.0 } else { 0.0 };
                assert_eq!(f32::from_bits(texel_of(&dst, 0, x, y, 0)[0]), want, "{}: ({x}, {y})", v.label);
            }
        }

        // uchar4 reads: zero and clamp outside, trap inside only.
        let img = TestImage::new(fmt(ChannelType::U8, 4), ArrayKind::D2, [5, 3, 1], 1, 1, |_, _, x, y, _, ch| {
            x * 40 + y * 10 + ch
        });
        surface(&mut table, 3, &img);
        let pts: Vec<[i32; 2]> = vec![[0, 0], [4, 2], [-1, 0], [5, 0], [2, -1], [0, 3], [100, 100], [-7, 1], [3, 1]];
        let xy = Buf::from(&pts);
        let out = Buf::zeroed(pts.len() * 4);
        let mut bufs = img.bufs();
        bufs.extend([&xy, &out]);
        for mode in 0..2 {
            let args = Args::default().p(3u64).buf(&xy).buf(&out).p(pts.len() as i32).p(mode);
            m.run_with("read_uchar4", 1, 32, &args, &bufs, &table).unwrap_or_else(|e| panic!("{}: {e}", v.label));
            let got: Vec<[u8; 4]> = out.get();
            for (p, g) in pts.iter().zip(&got) {
                let inside = (0..5).contains(&p[0]) && (0..3).contains(&p[1]);
                let want = if inside || mode == 1 {
                    let t = texel_of(&img, 0, p[0].clamp(0, 4) as u32, p[1].clamp(0, 2) as u32, 0);
                    t.map(|c| c as u8)
                } else {
                    [0; 4]
                };
                assert_eq!(*g, want, "{}: mode {mode} at {p:?}", v.label);
            }
        }
        let args = Args::default().p(3u64).buf(&xy).buf(&out).p(2i32).p(2i32);
        m.run_with("read_uchar4", 1, 32, &args, &bufs, &table).unwrap_or_else(|e| panic!("{}: {e}", v.label));
        let args = Args::default().p(3u64).buf(&xy).buf(&out).p(pts.len() as i32).p(2i32);
        let e = m.run_with("read_uchar4", 1, 32, &args, &bufs, &table).unwrap_err();
        assert!(matches!(e, ExecError::LaunchFailure { ref reason, .. } if reason.contains("outside")), "{e}");
        assert_eq!(e.cuda_error(), 719);

        // uchar4 writes: zero drops, clamp writes the nearest texel.
        let img = TestImage::new(fmt(ChannelType::U8, 4), ArrayKind::D2, [5, 3, 1], 1, 1, |_, _, _, _, _, _| 0);
        surface(&mut table, 4, &img);
        let pts: Vec<[i32; 2]> = vec![[1, 1], [-3, 1], [9, 2], [2, 7], [-1, -1]];
        let xy = Buf::from(&pts);
        let mut bufs = img.bufs();
        bufs.push(&xy);
        m.run_with("write_uchar4", 1, 32, &Args::default().p(4u64).buf(&xy).p(5i32).p(0i32), &bufs, &table).unwrap();
        let written = |img: &TestImage| {
            let mut v = Vec::new();
            for y in 0..3 {
                for x in 0..5 {
                    let t = texel_of(img, 0, x, y, 0);
                    if t != [0; 4] {
                        v.push(([x, y], t));
                    }
                }
            }
            v
        };
        assert_eq!(written(&img), vec![([1, 1], [0, 1, 2, 200])], "{}: zero mode", v.label);
        let img = TestImage::new(fmt(ChannelType::U8, 4), ArrayKind::D2, [5, 3, 1], 1, 1, |_, _, _, _, _, _| 0);
        surface(&mut table, 4, &img);
        let mut bufs = img.bufs();
        bufs.push(&xy);
        m.run_with("write_uchar4", 1, 32, &Args::default().p(4u64).buf(&xy).p(4i32).p(1i32), &bufs, &table).unwrap();
        let want = vec![
            ([1, 1], [0, 1, 2, 200]),
            ([0, 1], [1, 2, 3, 200]),
            ([4, 2], [2, 3, 4, 200]),
            ([2, 2], [3, 4, 5, 200]),
        ];
        let mut got = written(&img);
        got.sort();
        let mut want = want;
        want.sort();
        assert_eq!(got, want, "{}: clamp mode", v.label);
        let e = m.run_with("write_uchar4", 1, 32, &Args::default().p(4u64).buf(&xy).p(5i32).p(2i32), &bufs, &table);
        assert_eq!(e.unwrap_err().cuda_error(), 719, "{}: trap mode", v.label);

        // 1D float4, read and written in place.
        let img = TestImage::new(fmt(ChannelType::F32, 4), ArrayKind::D1, [10, 1, 1], 1, 1, |_, _, x, _, _, ch| {
            (x as f32 * 10.0 + ch as f32).to_bits()
        });
        surface(&mut table, 5, &img);
        m.run_with("bump1d", 1, 32, &Args::default().p(5u64).p(10i32), &img.bufs(), &table).unwrap();
        for x in 0..10 {
            let t = texel_of(&img, 0, x, 0, 0).map(f32::from_bits);
            let b = x as f32 * 10.0;
            assert_eq!(t, [b + 1.0, b + 3.0, b + 5.0, b + 7.0], "{}: 1D texel {x}", v.label);
        }

        // 3D int2.
        let img = TestImage::new(fmt(ChannelType::S32, 2), ArrayKind::D3, [4, 3, 2], 1, 1, |_, _, _, _, _, _| 0);
        surface(&mut table, 6, &img);
        m.run_with("fill3d", 6, 32, &Args::default().p(6u64).p(4i32).p(3i32).p(2i32), &img.bufs(), &table).unwrap();
        for z in 0..2 {
            for y in 0..3 {
                for x in 0..4 {
                    assert_eq!(texel_of(&img, 0, x, y, z)[..2], [x + 100 * y, z], "{}: 3D ({x}, {y}, {z})", v.label);
                }
            }
        }

        // Layered 2D short2: layer 2 halved into layer 0.
        let img =
            TestImage::new(fmt(ChannelType::S16, 2), ArrayKind::Layered2D, [3, 2, 1], 3, 1, |_, l, x, y, _, ch| {
                if l == 2 { ((x as i32 * 7 - y as i32 * 100 - ch as i32) as u32) & 0xffff } else { 0 }
            });
        surface(&mut table, 7, &img);
        m.run_with("layers2d", 2, 32, &Args::default().p(7u64).p(3i32).p(2i32).p(2i32).p(0i32), &img.bufs(), &table)
            .unwrap();
        for y in 0..2 {
            for x in 0..3 {
                let src = texel_of(&img, 2, x, y, 0);
                let dst = texel_of(&img, 0, x, y, 0);
                for ch in 0..2 {
                    assert_eq!(
                        dst[ch] as u16 as i16,
                        (src[ch] as u16 as i16) / 2,
                        "{}: layer texel ({x}, {y})",
                        v.label
                    );
                }
            }
        }

        // Cubemap faces.
        let img = TestImage::new(fmt(ChannelType::F32, 1), ArrayKind::Cubemap, [3, 3, 1], 6, 1, |_, _, _, _, _, _| 0);
        surface(&mut table, 8, &img);
        m.run_with("cube_faces", 18, 32, &Args::default().p(8u64).p(3i32), &img.bufs(), &table).unwrap();
        for face in 0..6 {
            for y in 0..3 {
                for x in 0..3 {
                    let got = f32::from_bits(texel_of(&img, face, x, y, 0)[0]);
                    assert_eq!(got, (face * 1000 + y * 10 + x) as f32, "{}: face {face} ({x}, {y})", v.label);
                }
            }
        }

        // Layered 1D uint2.
        let img =
            TestImage::new(fmt(ChannelType::U32, 2), ArrayKind::Layered1D, [5, 1, 1], 2, 1, |_, l, x, _, _, ch| {
                l << 16 | x << 4 | ch
            });
        surface(&mut table, 9, &img);
        let out = Buf::zeroed(40);
        let mut bufs = img.bufs();
        bufs.push(&out);
        m.run_with("layered1d", 1, 32, &Args::default().p(9u64).p(5i32).p(1i32).buf(&out), &bufs, &table).unwrap();
        let want: Vec<u32> = (0..5).flat_map(|x| [1 << 16 | x << 4, 1 << 16 | x << 4 | 1]).collect();
        assert_eq!(out.get::<u32>(), want, "{}: layered 1D", v.label);
    }
}

/// sust.p converts 32-bit values to the surface's format; suq answers the surface's shape.
#[test]
fn formatted_stores_and_surface_queries() {
    for v in variants("surfaces.cu", &[70], false) {
        let m = Loaded::new(&v.ptx, &v.label);
        let mut table = ResourceTable::default();
        let img = TestImage::new(fmt(ChannelType::F16, 2), ArrayKind::D2, [6, 4, 1], 1, 1, |_, _, _, _, _, _| 0);
        surface(&mut table, 1, &img);
        let q = Buf::zeroed(7 * 4);
        let mut bufs = img.bufs();
        bufs.push(&q);
        let args = Args::default().p(1u64).p(5i32).p(3i32).p(1.5f32).p(-1.0f32 / 3.0).buf(&q);
        m.run_with("formatted", 1, 1, &args, &bufs, &table).unwrap_or_else(|e| panic!("{}: {e}", v.label));
        // 1.5 and -1/3 as halves (round to nearest even).
        assert_eq!(texel_of(&img, 0, 5, 3, 0)[..2], [0x3e00, 0xb555], "{}", v.label);
        // width, height, depth, array size, OpenCL's CL_HALF_FLOAT and CL_RG, memory layout (not linear).
        assert_eq!(q.get::<u32>(), vec![6, 4, 1, 0, 0x10DD, 0x10B2, 0], "{}", v.label);
        // An unknown surface handle.
        let e = m.run_with("formatted", 1, 1, &args, &bufs, &ResourceTable::default()).unwrap_err();
        assert!(matches!(e, ExecError::InvalidHandle { handle: 1, surface: true, .. }), "{e}");
    }
}

// ----- ground truth from a GPU (texture_probe.cu, texture_probe_h100.txt) -----

/// One lookup of `texture_probe.cu`, as its kernel reads it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct ProbeQ {
    op: i32,
    layer: i32,
    x: f32,
    y: f32,
    z: f32,
    lod: f32,
    dx0: f32,
    dx1: f32,
    dy0: f32,
    dy1: f32,
}

/// A texture or surface as the probe describes it.
#[derive(Clone, Debug, Default)]
struct ProbeCfg {
    res: u32,
    kind: u32,
    ty: u32,
    ch: u32,
    w: u32,
    h: u32,
    d: u32,
    layers: u32,
    levels: u32,
    addr: [u32; 3],
    filter: u32,
    read: u32,
    norm: u32,
    srgb: u32,
    mipfilter: u32,
    floats: [f32; 7],
    data: Vec<Vec<u8>>,
}

impl ProbeCfg {
    fn parse(f: &[&str]) -> ProbeCfg {
        let n = |i: usize| f[i].parse::<u32>().unwrap_or_else(|_| panic!("field {i} of {f:?}"));
        let h = |i: usize| f32::from_bits(u32::from_str_radix(f[i], 16).unwrap());
        ProbeCfg {
            res: n(0),
            kind: n(1),
            ty: n(2),
            ch: n(3),
            w: n(4),
            h: n(5),
            d: n(6),
            layers: n(7),
            levels: n(8),
            addr: [n(9), n(10), n(11)],
            filter: n(12),
            read: n(13),
            norm: n(14),
            srgb: n(15),
            mipfilter: n(16),
            floats: std::array::from_fn(|k| h(17 + k)),
            data: Vec::new(),
        }
    }

    fn format(&self) -> ChannelFormat {
        use ChannelType::*;
        fmt([U8, U16, U32, S8, S16, S32, F16, F32][self.ty as usize], self.ch as u8)
    }

    fn describe(&self) -> String {
        let res = ["array", "mipmapped", "linear", "pitch2D"][self.res as usize];
        let kind = ["1D", "2D", "3D", "layered 1D", "layered 2D", "cubemap", "layered cubemap"][self.kind as usize];
        format!(
            "{res} {kind} {:?}x{} {}x{}x{} addr {:?} filter {} read {} normalized {} srgb {} mip filter {}",
            self.format().ty,
            self.ch,
            self.w,
            self.h,
            self.d,
            self.addr,
            self.filter,
            self.read,
            self.norm,
            self.srgb,
            self.mipfilter
        )
    }

    /// The array holding the recorded texels (packed: layer or z, y, x, channel).
    fn image(&self) -> TestImage {
        use ArrayKind::*;
        let kind = [D1, D2, D3, Layered1D, Layered2D, Cubemap, LayeredCubemap][self.kind as usize];
        let format = self.format();
        let csize = format.ty.bytes() as usize;
        let one_d = matches!(kind, D1 | Layered1D);
        let extent = [self.w, if one_d { 1 } else { self.h }, if kind == D3 { self.d } else { 1 }];
        let data = &self.data;
        TestImage::new(format, kind, extent, self.layers, self.levels, |lv, layer, x, y, z, ch| {
            let dim = |k: usize| (extent[k] >> lv).max(1);
            let dz = layer * dim(2) + z;
            let i = ((((dz * dim(1) + y) * dim(0) + x) * format.channels as u32 + ch) as usize) * csize;
            let mut b = [0u8; 4];
            b[..csize].copy_from_slice(&data[lv as usize][i..i + csize]);
            u32::from_le_bytes(b)
        })
    }

    fn desc(&self) -> TextureDesc {
        let mode = |m: u32| AddressMode::from_cuda(m as i32).unwrap();
        let filter = |f: u32| FilterMode::from_cuda(f as i32).unwrap();
        TextureDesc {
            address: self.addr.map(mode),
            filter: filter(self.filter),
            read: ReadMode::from_cuda(self.read as i32).unwrap(),
            srgb: self.srgb != 0,
            border_color: [self.floats[0], self.floats[1], self.floats[2], self.floats[3]],
            normalized_coords: self.norm != 0,
            mipmap_filter: filter(self.mipfilter),
            mipmap_level_bias: self.floats[4],
            min_mipmap_level_clamp: self.floats[5],
            max_mipmap_level_clamp: self.floats[6],
            ..TextureDesc::default()
        }
    }
}

/// A recorded texture with what the GPU answered for it.
#[derive(Default)]
struct ProbeTexture {
    cfg: ProbeCfg,
    refused: Option<i32>,
    lookups: Vec<(ProbeQ, [u32; 4])>,
    query: Vec<u32>,
}

/// Everything a probe run recorded.
#[derive(Default)]
struct ProbeRecord {
    textures: Vec<(u32, ProbeTexture)>,
    surfaces: Vec<(u32, ProbeCfg)>,
    /// (surface, mode, x, y, packed uchar4)
    surface_reads: Vec<(u32, u32, i32, i32, u32)>,
    /// (surface, mode, array bytes after the writes)
    surface_writes: Vec<(u32, u32, Vec<u8>)>,
    surface_queries: Vec<(u32, Vec<u32>)>,
    faults: Vec<(String, i32)>,
}

fn hex_bytes(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap()).collect()
}

fn parse_probe(text: &str) -> ProbeRecord {
    let mut r = ProbeRecord::default();
    let hex = |s: &str| u32::from_str_radix(s, 16).unwrap_or_else(|_| panic!("hex {s}"));
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let Some((&tag, rest)) = f.split_first() else { continue };
        let id = || rest[0].parse::<u32>().unwrap();
        match tag {
            "texture" => {
                r.textures.push((id(), ProbeTexture { cfg: ProbeCfg::parse(&rest[1..]), ..Default::default() }))
            }
            "surface" => r.surfaces.push((id(), ProbeCfg::parse(&rest[1..]))),
            "data" => {
                let bytes = hex_bytes(rest.get(2).copied().unwrap_or(""));
                if let Some((_, t)) = r.textures.iter_mut().find(|(i, _)| *i == id()) {
                    t.cfg.data.push(bytes);
                } else if let Some((_, s)) = r.surfaces.iter_mut().find(|(i, _)| *i == id()) {
                    s.data.push(bytes);
                }
            }
            "refused" => {
                let t = r.textures.iter_mut().find(|(i, _)| *i == id()).expect("refused texture");
                t.1.refused = Some(rest[1].parse().unwrap());
            }
            "L" => {
                let i = |k: usize| rest[k].parse::<i32>().unwrap();
                let fl = |k: usize| f32::from_bits(hex(rest[k]));
                let q = ProbeQ {
                    op: i(1),
                    layer: i(2),
                    x: fl(3),
                    y: fl(4),
                    z: fl(5),
                    lod: fl(6),
                    dx0: fl(7),
                    dx1: fl(8),
                    dy0: fl(9),
                    dy1: fl(10),
                };
                assert_eq!(rest[11], ":", "{line}");
                let res = [hex(rest[12]), hex(rest[13]), hex(rest[14]), hex(rest[15])];
                let t = r.textures.iter_mut().find(|(i, _)| *i == id()).expect("lookup of a known texture");
                t.1.lookups.push((q, res));
            }
            "query" => {
                let t = r.textures.iter_mut().find(|(i, _)| *i == id()).expect("query of a known texture");
                t.1.query = rest[1..].iter().map(|x| x.parse().unwrap()).collect();
            }
            "S" => r.surface_reads.push((
                id(),
                rest[1].parse().unwrap(),
                rest[2].parse().unwrap(),
                rest[3].parse().unwrap(),
                hex(rest[5]),
            )),
            "W" => {
                r.surface_writes.push((id(), rest[1].parse().unwrap(), hex_bytes(rest.get(3).copied().unwrap_or(""))))
            }
            "squery" => r.surface_queries.push((id(), rest[1..].iter().map(|x| x.parse().unwrap()).collect())),
            "fault" => r.faults.push((rest[0].to_string(), rest[1].parse().unwrap())),
            _ => {}
        }
    }
    r
}

/// The points `texture_probe.cu`'s surface section reads and writes.
const SURFACE_POINTS: [[i32; 2]; 14] = [
    [0, 0],
    [4, 2],
    [-1, 0],
    [5, 0],
    [2, -1],
    [0, 3],
    [100, 100],
    [-7, 1],
    [3, 1],
    [9, 2],
    [-3, 2],
    [2, 7],
    [4, -1],
    [1, 1],
];

/// Replays a probe record on the interpreter; returns every difference, grouped by texture.
fn replay_probe(m: &Loaded, rec: &ProbeRecord) -> Vec<String> {
    let mut wrong = Vec::new();
    let mut lookups = 0;
    for (id, t) in &rec.textures {
        let cfg = &t.cfg;
        let what = format!("texture {id} ({})", cfg.describe());
        // Build the resource over host copies of the recorded texels.
        let img;
        let linear;
        let (resource, bufs): (Resource, Vec<&Buf>) = match cfg.res {
            0 | 1 => {
                img = cfg.image();
                let a = img.desc();
                (if cfg.res == 0 { Resource::Array(a) } else { Resource::Mipmapped(a) }, img.bufs())
            }
            2 => {
                linear = Buf::from(&cfg.data[0]);
                let size = cfg.data[0].len() as u64;
                (Resource::Linear { base: linear.addr(), format: cfg.format(), size }, vec![&linear])
            }
            _ => {
                img = cfg.image();
                let l = img.levels[0].1;
                let r = Resource::Pitch2D {
                    base: l.base,
                    format: cfg.format(),
                    width: l.width,
                    height: l.height,
                    pitch: l.row_pitch,
                };
                (r, img.bufs())
            }
        };
        let tex = Texture { resource, desc: cfg.desc() };
        match (t.refused, tex.validate()) {
            (Some(e), Ok(())) => {
                wrong.push(format!("{what}: the GPU refused it (error {e}), the interpreter accepts it"));
                continue;
            }
            (Some(_), Err(_)) => continue,
            (None, Err(e)) => {
                wrong.push(format!("{what}: the GPU accepted it, the interpreter refuses it: {e}"));
                continue;
            }
            (None, Ok(())) => {}
        }
        let mut table = ResourceTable::default();
        table.textures.insert(5, Arc::new(tex));
        let qs: Vec<ProbeQ> = t.lookups.iter().map(|(q, _)| *q).collect();
        let (bq, bo, bquery) = (Buf::from(&qs), Buf::zeroed(qs.len() * 16), Buf::zeroed(13 * 4));
        let mut all = bufs.clone();
        all.extend([&bq, &bo, &bquery]);
        let args = Args::default().p(5u64).buf(&bq).buf(&bo).p(qs.len() as i32);
        if let Err(e) = m.run_with("probe_tex", (qs.len() as u32).div_ceil(128), 128, &args, &all, &table) {
            wrong.push(format!("{what}: {e}"));
            continue;
        }
        let got: Vec<[u32; 4]> = bo.get();
        let mut bad = Vec::new();
        for ((q, gpu), ours) in t.lookups.iter().zip(&got) {
            lookups += 1;
            if gpu != ours {
                bad.push(format!("    {q:?}\n      H100 {gpu:08x?}\n      ours {ours:08x?}"));
            }
        }
        if !bad.is_empty() {
            wrong.push(format!(
                "{what}: {} of {} lookups differ:\n{}",
                bad.len(),
                got.len(),
                bad[..bad.len().min(6)].join("\n")
            ));
        }
        if !t.query.is_empty() {
            m.run_with("probe_query", 1, 1, &Args::default().p(5u64).buf(&bquery), &all, &table).unwrap();
            let ours: Vec<u32> = bquery.get();
            if ours != t.query {
                wrong.push(format!("{what}: txq answers {ours:?}, H100 {:?}", t.query));
            }
        }
    }
    println!("{} textures, {lookups} lookups replayed", rec.textures.len());
    // Surfaces: reads and writes under each boundary mode, and suq.
    for (id, cfg) in &rec.surfaces {
        let pts = Buf::from(&SURFACE_POINTS);
        for mode in 0..2u32 {
            let img = cfg.image();
            let mut table = ResourceTable::default();
            surface(&mut table, 5, &img);
            let out = Buf::zeroed(64 * 4);
            let mut all = img.bufs();
            all.extend([&pts, &out]);
            let n = SURFACE_POINTS.len() as i32;
            let args = Args::default().p(5u64).buf(&pts).buf(&out).p(n).p(mode as i32);
            m.run_with("probe_surf_read", 1, 64, &args, &all, &table).unwrap();
            let got: Vec<u32> = out.get();
            for (k, &(sid, smode, x, y, v)) in
                rec.surface_reads.iter().filter(|r| r.0 == *id && r.1 == mode).enumerate()
            {
                if got[k] != v || SURFACE_POINTS[k] != [x, y] {
                    wrong.push(format!(
                        "surface {sid} mode {smode} read at ({x}, {y}): ours {:#x}, H100 {v:#x}",
                        got[k]
                    ));
                }
            }
            let args = Args::default().p(5u64).buf(&pts).p(n).p(mode as i32);
            m.run_with("probe_surf_write", 1, 1, &args, &all, &table).unwrap();
            let mut ours = Vec::new();
            for y in 0..cfg.h {
                for x in 0..cfg.w {
                    ours.extend(img.raw(0, 0, x, y, 0)[..4].iter().map(|&c| c as u8));
                }
            }
            for (_, _, gpu) in rec.surface_writes.iter().filter(|w| w.0 == *id && w.1 == mode) {
                if *gpu != ours {
                    wrong.push(format!("surface {id} mode {mode} writes: ours {ours:02x?}\n  H100 {gpu:02x?}"));
                }
            }
        }
        let img = cfg.image();
        let mut table = ResourceTable::default();
        surface(&mut table, 5, &img);
        let out = Buf::zeroed(7 * 4);
        let mut all = img.bufs();
        all.push(&out);
        m.run_with("probe_surf_query", 1, 1, &Args::default().p(5u64).buf(&out), &all, &table).unwrap();
        let ours: Vec<u32> = out.get();
        for (_, gpu) in rec.surface_queries.iter().filter(|q| q.0 == *id) {
            if *gpu != ours {
                wrong.push(format!("surface {id}: suq answers {ours:?}, H100 {gpu:?}"));
            }
        }
    }
    // Faults: the same kernels on the same mistakes report the same errors.
    for (name, gpu) in &rec.faults {
        let img = TestImage::new(fmt(ChannelType::U8, 4), ArrayKind::D2, [5, 3, 1], 1, 1, |_, _, _, _, _, _| 0);
        let mut table = ResourceTable::default();
        surface(&mut table, 5, &img);
        let pts = Buf::from(&[[1i32, 1], [7, 1]]);
        let out = Buf::zeroed(64);
        let one = Buf::from(&[ProbeQ { op: 1, x: 0.5, y: 0.5, ..ProbeQ::default() }]);
        let mut all = img.bufs();
        all.extend([&pts, &out, &one]);
        let r = match name.as_str() {
            "texture_handle" => {
                m.run_with("probe_tex", 1, 1, &Args::default().p(0xdeadu64).buf(&one).buf(&out).p(1i32), &all, &table)
            }
            "surface_write_trap" => {
                m.run_with("probe_surf_write", 1, 1, &Args::default().p(5u64).buf(&pts).p(2i32).p(2i32), &all, &table)
            }
            "surface_read_trap" => m.run_with(
                "probe_surf_read",
                1,
                2,
                &Args::default().p(5u64).buf(&pts).buf(&out).p(2i32).p(2i32),
                &all,
                &table,
            ),
            _ => m.run_with(
                "probe_surf_read",
                1,
                1,
                &Args::default().p(0xdeadu64).buf(&pts).buf(&out).p(1i32).p(2i32),
                &all,
                &table,
            ),
        };
        let ours = r.err().map_or(0, |e| e.cuda_error());
        if ours != *gpu {
            wrong.push(format!("fault {name}: ours cudaError {ours}, H100 {gpu}"));
        }
    }
    wrong
}

/// The H100's answers for `texture_probe.cu`'s cases, bit for bit (when the recording is present).
#[test]
fn matches_h100_texture_probe() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/exec_data/texture_probe_h100.txt");
    let Ok(text) = std::fs::read_to_string(&path) else {
        println!("{} is not recorded yet: nothing to replay", path.display());
        return;
    };
    let rec = parse_probe(&text);
    assert!(!rec.textures.is_empty() && !rec.faults.is_empty(), "{}: an incomplete recording", path.display());
    for v in variants("texture_probe.cu", &[80], false) {
        let m = Loaded::new(&v.ptx, &v.label);
        let wrong = replay_probe(&m, &rec);
        assert!(wrong.is_empty(), "{}: {} differences from the H100:\n{}", v.label, wrong.len(), wrong.join("\n"));
    }
}

/// A recording in the probe's format whose answers come from the reference, to check the replay itself: it finds
/// nothing to report on the reference's answers, and reports every answer changed.
fn synthetic_probe_text() -> String {
    let mut out = String::new();
    let mut seed = 0x5eed_u64;
    let cfg_line = |id: u32, c: &ProbeCfg, what: &str, out: &mut String| {
        let f = c.floats.map(|x| format!("{:x}", x.to_bits())).join(" ");
        out.push_str(&format!(
            "{what} {id} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {f}\n",
            c.res,
            c.kind,
            c.ty,
            c.ch,
            c.w,
            c.h,
            c.d,
            c.layers,
            c.levels,
            c.addr[0],
            c.addr[1],
            c.addr[2],
            c.filter,
            c.read,
            c.norm,
            c.srgb,
            c.mipfilter
        ));
        for (l, d) in c.data.iter().enumerate() {
            let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
            out.push_str(&format!("data {id} {l} {hex}\n"));
        }
    };
    let lookup = |id: u32, q: &ProbeQ, r: [u32; 4], out: &mut String| {
        let h = |x: f32| format!("{:x}", x.to_bits());
        out.push_str(&format!(
            "L {id} {} {} {} {} {} {} {} {} {} {} : {:x} {:x} {:x} {:x}\n",
            q.op,
            q.layer,
            h(q.x),
            h(q.y),
            h(q.z),
            h(q.lod),
            h(q.dx0),
            h(q.dx1),
            h(q.dy0),
            h(q.dy1),
            r[0],
            r[1],
            r[2],
            r[3]
        ));
    };
    let mut make = |ty: u32, ch: u32, kind: u32, [w, h, d]: [u32; 3], layers: u32| {
        let esize = [1, 2, 4, 1, 2, 4, 2, 4][ty as usize] * ch;
        let n = (w * h * d * layers * esize) as usize;
        let data: Vec<u8> =
            (0..n)
                .map(|i| {
                    if ty == 7 && i % 4 == 3 {
                        0x40 + (xorshift(&mut seed) % 8) as u8
                    } else {
                        xorshift(&mut seed) as u8
                    }
                })
                .collect();
        ProbeCfg { kind, ty, ch, w, h, d, layers, levels: 1, addr: [1; 3], data: vec![data], ..ProbeCfg::default() }
    };
    // A filtered 2D float texture with normalized coordinates, wrapping and mirroring.
    let mut c = make(7, 4, 1, [5, 3, 1], 1);
    (c.addr, c.filter, c.norm) = ([0, 2, 1], 1, 1);
    c.floats[..4].copy_from_slice(&[0.25, -2.0, 7.5, 1e9]);
    cfg_line(1, &c, "texture", &mut out);
    let img = c.image();
    let r = Ref { img: &img, d: c.desc(), mipmapped: false };
    for p in grid(NORMALIZED, &NORMALIZED[..6]) {
        lookup(1, &ProbeQ { op: 1, x: p.x, y: p.y, ..ProbeQ::default() }, r.sample(G::D2, &p), &mut out);
    }
    out.push_str("query 1 5 3 1 4318 4277 1 0 0 1 0 1 3 2\n");
    // Integer gathers with the border colour.
    let mut c = make(0, 4, 1, [4, 3, 1], 1);
    (c.addr, c.norm) = ([3; 3], 1);
    cfg_line(2, &c, "texture", &mut out);
    let img = c.image();
    let r = Ref { img: &img, d: c.desc(), mipmapped: false };
    for (k, p) in grid(&[-0.2, 0.1, 0.5, 0.9, 1.3], &[-0.1, 0.4, 1.1]).iter().enumerate() {
        let p = Coord { comp: (k % 4) as i32, ..*p };
        lookup(2, &ProbeQ { op: 12, layer: p.comp, x: p.x, y: p.y, ..ProbeQ::default() }, r.gather(&p), &mut out);
    }
    // A cubemap.
    let mut c = make(7, 1, 5, [4, 4, 1], 6);
    c.norm = 1;
    cfg_line(3, &c, "texture", &mut out);
    let img = c.image();
    let r = Ref { img: &img, d: c.desc(), mipmapped: false };
    for d in [[1.0, 0.25, -0.5], [-0.3, -2.0, 0.7], [0.1, 0.2, 3.0], [-0.9, 0.5, -1.0]] {
        let p = Coord { z: d[2], ..at(d[0], d[1]) };
        lookup(3, &ProbeQ { op: 5, x: d[0], y: d[1], z: d[2], ..ProbeQ::default() }, r.sample(G::Cube, &p), &mut out);
    }
    // A texture the GPU refuses (linear filtering of integers): the interpreter must refuse it too.
    let mut c = make(5, 1, 1, [2, 2, 1], 1);
    c.filter = 1;
    cfg_line(4, &c, "texture", &mut out);
    out.push_str("refused 4 1\n");
    // A surface: reads under zero and clamp modes, the writes' effect, suq.
    let c = make(0, 4, 1, [5, 3, 1], 1);
    cfg_line(5, &c, "surface", &mut out);
    let texel = |x: i32, y: i32| {
        let i = ((y * 5 + x) * 4) as usize;
        u32::from_le_bytes(c.data[0][i..i + 4].try_into().unwrap())
    };
    for mode in 0..2 {
        for [x, y] in SURFACE_POINTS {
            let inside = (0..5).contains(&x) && (0..3).contains(&y);
            let v = if inside || mode == 1 { texel(x.clamp(0, 4), y.clamp(0, 2)) } else { 0 };
            out.push_str(&format!("S 5 {mode} {x} {y} : {v:x}\n"));
        }
        let mut bytes = c.data[0].clone();
        for (i, [x, y]) in SURFACE_POINTS.iter().enumerate() {
            let inside = (0..5).contains(x) && (0..3).contains(y);
            if inside || mode == 1 {
                let o = ((y.clamp(&0, &2) * 5 + x.clamp(&0, &4)) * 4) as usize;
                bytes[o..o + 4].copy_from_slice(&[i as u8, i as u8 + 1, i as u8 + 2, 0xC0 + i as u8]);
            }
        }
        out.push_str(&format!("W 5 {mode} : {}\n", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()));
    }
    out.push_str("squery 5 5 3 1 4314 4277 0 0\n");
    out.push_str("fault texture_handle 700\nfault surface_write_trap 719\nfault surface_read_trap 719\nfault surface_handle 700\n");
    out
}

#[test]
fn probe_replay_reports_every_difference() {
    let text = synthetic_probe_text();
    for v in variants("texture_probe.cu", &[80], false) {
        let m = Loaded::new(&v.ptx, &v.label);
        let wrong = replay_probe(&m, &parse_probe(&text));
        assert!(wrong.is_empty(), "{}: the replay of the reference's answers differs:\n{}", v.label, wrong.join("\n"));
        // One changed result, query, surface answer or fault code each: four differences.
        let changed: Vec<String> = text
            .lines()
            .map(|l| match l {
                _ if l.starts_with("L 3 ") => format!("{} : 1 2 3 4", l.split(" : ").next().unwrap()),
                _ if l.starts_with("query 1 ") => l.replace(" 4318 ", " 4319 "),
                _ if l.starts_with("S 5 1 -1 0") => "S 5 1 -1 0 : 7".to_string(),
                "fault surface_handle 700" => "fault surface_handle 0".to_string(),
                _ => l.to_string(),
            })
            .collect();
        let wrong = replay_probe(&m, &parse_probe(&changed.join("\n")));
        assert_eq!(wrong.len(), 4, "{}: {wrong:#?}", v.label);
    }
}

/// Lookups at arbitrary bit patterns (coordinates, levels, layers, every operation) on every shape of texture, and
/// on descriptors no backend should make (three channels, no levels, empty extents, huge pitches), never panic:
/// they answer or fail the launch.
#[test]
fn arbitrary_lookups_never_panic() {
    let mut seed = 0xfeed_f00d_u64;
    for v in variants("texture_probe.cu", &[80], false) {
        let m = Loaded::new(&v.ptx, &v.label);
        let mut textures = Vec::new();
        for (kind, layers) in [
            (ArrayKind::D1, 1),
            (ArrayKind::D2, 1),
            (ArrayKind::D3, 1),
            (ArrayKind::Layered1D, 3),
            (ArrayKind::Layered2D, 2),
            (ArrayKind::Cubemap, 6),
            (ArrayKind::LayeredCubemap, 12),
        ] {
            let d3 = if kind == ArrayKind::D3 { 4 } else { 1 };
            let h = if matches!(kind, ArrayKind::D1 | ArrayKind::Layered1D) { 1 } else { 4 };
            let img = TestImage::new(fmt(ChannelType::F16, 2), kind, [4, h, d3], layers, 3, |_, _, x, y, _, _| x ^ y);
            textures.push((Resource::Mipmapped(img.desc()), img));
        }
        let mut bad = textures[1].1.desc();
        bad.format.channels = 3;
        bad.levels[1].row_pitch = u64::MAX / 2;
        bad.levels[2].width = 0;
        let empty = ArrayDesc { levels: Vec::new(), ..bad.clone() };
        let keep = TestImage::new(fmt(ChannelType::U8, 1), ArrayKind::D2, [1, 1, 1], 1, 1, |_, _, _, _, _, _| 0);
        textures.push((Resource::Mipmapped(bad), TestImage { levels: Vec::new(), ..keep }));
        textures.push((
            Resource::Array(empty),
            TestImage::new(fmt(ChannelType::U8, 1), ArrayKind::D2, [1, 1, 1], 1, 1, |_, _, _, _, _, _| 0),
        ));
        for (resource, img) in &textures {
            for filter in [FilterMode::Point, FilterMode::Linear] {
                for mode in MODES {
                    let d = TextureDesc {
                        max_mipmap_level_clamp: 9.0,
                        mipmap_filter: filter,
                        ..desc([mode; 3], filter, ReadMode::ElementType, xorshift(&mut seed).is_multiple_of(2))
                    };
                    let mut table = ResourceTable::default();
                    table.textures.insert(5, Arc::new(Texture { resource: resource.clone(), desc: d }));
                    let qs: Vec<ProbeQ> = (0..256)
                        .map(|_| {
                            let w: [u64; 10] = std::array::from_fn(|_| xorshift(&mut seed));
                            let f = |k: usize| f32::from_bits(w[k] as u32);
                            ProbeQ {
                                op: (w[0] % 20) as i32,
                                layer: w[1] as i32,
                                x: f(2),
                                y: f(3),
                                z: f(4),
                                lod: f(5),
                                dx0: f(6),
                                dx1: f(7),
                                dy0: f(8),
                                dy1: f(9),
                            }
                        })
                        .collect();
                    let (bq, bo) = (Buf::from(&qs), Buf::zeroed(qs.len() * 16));
                    let mut all = img.bufs();
                    all.extend([&bq, &bo]);
                    let args = Args::default().p(5u64).buf(&bq).buf(&bo).p(qs.len() as i32);
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        m.run_with("probe_tex", 2, 128, &args, &all, &table)
                    }));
                    assert!(r.is_ok(), "{}: a lookup panicked on {resource:?}", v.label);
                }
            }
        }
    }
}
