//! A minimal reader for 64-bit little-endian ELF images: the header, the section table with
//! names, and the symbol table. It serves both cubins (device code, `e_machine` 190) and host
//! objects and executables, whose `.nv_fatbin` and `.nvFatBinSegment` sections hold fat
//! binaries and their wrappers.
//!
//! Everything is validated on [`Elf::parse`]: every section's bytes lie inside the image (except
//! `SHT_NOBITS`), every section name is a NUL-terminated UTF-8 string inside the section name
//! table. Nothing is allocated in proportion to a header field without first checking that the
//! image is long enough to hold what the field describes.

use crate::FatbinError;
use crate::bytes::{u8_at, u16_at, u32_at, u64_at};

/// `e_machine` of NVIDIA cubins.
pub const EM_CUDA: u16 = 190;
/// Section type holding no bytes in the file (`.bss`, `.nv.global`, ...).
pub const SHT_NOBITS: u32 = 8;
/// Section type of the symbol table.
pub const SHT_SYMTAB: u32 = 2;
/// Section type NVIDIA uses for `.nv.info` and `.nv.info.<kernel>` (`SHT_LOPROC`).
pub const SHT_CUDA_INFO: u32 = 0x7000_0000;
/// Symbol type of functions (`st_info & 0xf`).
pub const STT_FUNC: u8 = 2;
/// `st_other` bit marking a kernel entry point in a cubin, as opposed to a device function.
pub const STO_CUDA_ENTRY: u8 = 0x10;

const EHDR_SIZE: usize = 64;
const SHDR_SIZE: usize = 64;
const SYM_SIZE: usize = 24;
/// `e_shstrndx` value meaning "the real index is in section 0's `sh_link`".
const SHN_XINDEX: u16 = 0xffff;

/// The parts of the ELF file header this crate uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// `e_ident[EI_OSABI]`: 0x33 for CUDA 11 cubins, 0x41 for CUDA 13 cubins, 0 for host files.
    pub os_abi: u8,
    /// `e_ident[EI_ABIVERSION]`.
    pub abi_version: u8,
    /// `e_type`: 1 relocatable, 2 executable, 3 shared object.
    pub elf_type: u16,
    /// `e_machine`: 190 for cubins, 62 for x86-64.
    pub machine: u16,
    /// `e_flags`: for cubins this encodes the SM architecture, differently across CUDA versions.
    pub flags: u32,
}

/// One section, with its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Section<'a> {
    pub index: usize,
    pub name: &'a str,
    pub sh_type: u32,
    pub flags: u64,
    /// Virtual address in linked images (executables, shared objects); 0 in relocatable files.
    pub addr: u64,
    pub offset: u64,
    pub size: u64,
    pub link: u32,
    pub info: u32,
    pub entsize: u64,
    /// The section's bytes; empty for `SHT_NOBITS`.
    pub data: &'a [u8],
}

/// One symbol table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Symbol<'a> {
    pub name: &'a str,
    /// `st_info`: binding in the high nibble, type in the low nibble.
    pub info: u8,
    /// `st_other`: visibility, and for cubins [`STO_CUDA_ENTRY`].
    pub other: u8,
    /// Index of the section the symbol is defined in.
    pub shndx: u16,
    pub value: u64,
    pub size: u64,
}

impl Symbol<'_> {
    /// The symbol type (`STT_*`).
    pub fn kind(&self) -> u8 {
        self.info & 0x0f
    }
}

/// A parsed ELF image borrowing its bytes.
#[derive(Debug, Clone)]
pub struct Elf<'a> {
    data: &'a [u8],
    header: Header,
    sections: Vec<Section<'a>>,
}

impl<'a> Elf<'a> {
    /// Parses the file header and the section table.
    pub fn parse(data: &'a [u8]) -> Result<Self, FatbinError> {
        if data.len() < EHDR_SIZE {
            return Err(FatbinError::truncated("ELF header", 0, EHDR_SIZE as u64, data.len()));
        }
        if data[..4] != *b"\x7fELF" {
            return Err(FatbinError::BadMagic {
                what: "ELF header",
                offset: 0,
                found: u32::from_be_bytes([data[0], data[1], data[2], data[3]]),
                expected: 0x7f45_4c46,
            });
        }
        if data[4] != 2 {
            return Err(FatbinError::elf(4, format!("ELF class {} is not 64-bit", data[4])));
        }
        if data[5] != 1 {
            return Err(FatbinError::elf(5, format!("ELF data encoding {} is not little-endian", data[5])));
        }
        // The length check above makes these reads infallible; `unwrap_or_default` keeps the
        // code panic-free without an `unwrap`.
        let field16 = |off| u16_at(data, off).unwrap_or_default();
        let header = Header {
            os_abi: data[7],
            abi_version: data[8],
            elf_type: field16(16),
            machine: field16(18),
            flags: u32_at(data, 48).unwrap_or_default(),
        };
        let shoff = u64_at(data, 40).unwrap_or_default();
        let shentsize = field16(58);
        let mut shnum = u64::from(field16(60));
        let mut shstrndx = field16(62);
        if shoff == 0 {
            return Ok(Elf { data, header, sections: Vec::new() });
        }
        if usize::from(shentsize) < SHDR_SIZE {
            return Err(FatbinError::elf(58, format!("section header size {shentsize} is below {SHDR_SIZE}")));
        }
        let table_start = usize::try_from(shoff).ok().filter(|&s| s < data.len()).ok_or_else(|| {
            FatbinError::elf(40, format!("section header table offset {shoff:#x} is outside the file"))
        })?;
        // Extended numbering: with more than 0xff00 sections the real count and name table
        // index live in section 0.
        if shnum == 0 || shstrndx == SHN_XINDEX {
            let first = raw_section(data, table_start)
                .ok_or_else(|| FatbinError::truncated("section header 0", table_start, SHDR_SIZE as u64, data.len()))?;
            if shnum == 0 {
                shnum = first.size;
            }
            if shstrndx == SHN_XINDEX {
                shstrndx = u16::try_from(first.link)
                    .map_err(|_| FatbinError::elf(table_start + 40, "section name table index out of range"))?;
            }
        }
        let table_len = shnum.saturating_mul(u64::from(shentsize));
        if table_len > (data.len() - table_start) as u64 {
            return Err(FatbinError::truncated(
                "section header table",
                table_start,
                table_len,
                data.len() - table_start,
            ));
        }
        // Bounded by the check above: at most len / 64 entries.
        let shnum = shnum as usize;
        let mut raw = Vec::with_capacity(shnum);
        for i in 0..shnum {
            let at = table_start + i * usize::from(shentsize);
            let section = raw_section(data, at)
                .ok_or_else(|| FatbinError::truncated("section header", at, SHDR_SIZE as u64, data.len()))?;
            raw.push((at, section));
        }

        let names = if shnum == 0 {
            &[][..]
        } else {
            let (at, names) = raw
                .get(usize::from(shstrndx))
                .ok_or_else(|| FatbinError::elf(62, format!("section name table index {shstrndx} out of range")))?;
            section_bytes(data, names, *at)?
        };
        let mut sections = Vec::with_capacity(shnum);
        for (index, (at, s)) in raw.into_iter().enumerate() {
            // Offset 0 of a string table is the empty string by convention; the null section
            // uses it even when there is no name table.
            let name = if s.name == 0 { "" } else { c_string(names, s.name, at)? };
            sections.push(Section {
                index,
                name,
                sh_type: s.sh_type,
                flags: s.flags,
                addr: s.addr,
                offset: s.offset,
                size: s.size,
                link: s.link,
                info: s.info,
                entsize: s.entsize,
                data: section_bytes(data, &s, at)?,
            });
        }
        Ok(Elf { data, header, sections })
    }

    /// The whole image.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// All sections in table order (index 0 is the null section).
    pub fn sections(&self) -> &[Section<'a>] {
        &self.sections
    }

    /// The first section called `name`.
    pub fn section(&self, name: &str) -> Option<&Section<'a>> {
        self.sections.iter().find(|s| s.name == name)
    }

    /// The entries of the first `SHT_SYMTAB` section (empty when there is none), with names
    /// resolved through the string table its `sh_link` names. Entry 0 (the null symbol) is
    /// included so that indices match the file.
    pub fn symbols(&self) -> Result<Vec<Symbol<'a>>, FatbinError> {
        let Some(symtab) = self.sections.iter().find(|s| s.sh_type == SHT_SYMTAB) else {
            return Ok(Vec::new());
        };
        let strtab = usize::try_from(symtab.link)
            .ok()
            .and_then(|i| self.sections.get(i))
            .ok_or_else(|| FatbinError::elf(symtab.offset as usize, "symbol table links to no string table"))?;
        let base = symtab.offset as usize;
        let count = symtab.data.len() / SYM_SIZE;
        let mut symbols = Vec::with_capacity(count);
        for i in 0..count {
            let at = i * SYM_SIZE;
            let d = symtab.data;
            let read = || -> Option<Symbol<'a>> {
                Some(Symbol {
                    name: "",
                    info: u8_at(d, at + 4)?,
                    other: u8_at(d, at + 5)?,
                    shndx: u16_at(d, at + 6)?,
                    value: u64_at(d, at + 8)?,
                    size: u64_at(d, at + 16)?,
                })
            };
            let mut symbol = read().ok_or_else(|| FatbinError::truncated("symbol", base + at, 24, d.len()))?;
            let name_offset = u32_at(d, at).unwrap_or_default();
            symbol.name = if name_offset == 0 { "" } else { c_string(strtab.data, name_offset, base + at)? };
            symbols.push(symbol);
        }
        Ok(symbols)
    }
}

/// A section header as stored, before names are resolved.
struct RawSection {
    name: u32,
    sh_type: u32,
    flags: u64,
    addr: u64,
    offset: u64,
    size: u64,
    link: u32,
    info: u32,
    entsize: u64,
}

fn raw_section(data: &[u8], at: usize) -> Option<RawSection> {
    Some(RawSection {
        name: u32_at(data, at)?,
        sh_type: u32_at(data, at + 4)?,
        flags: u64_at(data, at + 8)?,
        addr: u64_at(data, at + 16)?,
        offset: u64_at(data, at + 24)?,
        size: u64_at(data, at + 32)?,
        link: u32_at(data, at + 40)?,
        info: u32_at(data, at + 44)?,
        entsize: u64_at(data, at + 56)?,
    })
}

/// The bytes of a section; `at` is the offset of its header, for error messages.
fn section_bytes<'a>(data: &'a [u8], s: &RawSection, at: usize) -> Result<&'a [u8], FatbinError> {
    if s.sh_type == SHT_NOBITS || s.sh_type == 0 {
        return Ok(&[]);
    }
    crate::bytes::slice(data, s.offset, s.size).ok_or_else(|| {
        FatbinError::elf(at, format!("section bytes {:#x}+{:#x} lie outside the file", s.offset, s.size))
    })
}

/// The NUL-terminated UTF-8 string at `offset` in `table`; `at` locates the referring header.
fn c_string(table: &[u8], offset: u32, at: usize) -> Result<&str, FatbinError> {
    let tail = table
        .get(offset as usize..)
        .ok_or_else(|| FatbinError::elf(at, format!("name offset {offset:#x} is outside its string table")))?;
    let len = tail
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| FatbinError::elf(at, format!("name at {offset:#x} is not NUL-terminated")))?;
    std::str::from_utf8(&tail[..len]).map_err(|_| FatbinError::elf(at, format!("name at {offset:#x} is not UTF-8")))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds a small ELF64 image: `sections` are (name, type, link, info, bytes); a `.shstrtab` is
    /// appended. Used by the tests of this crate to make cubin-like images.
    pub(crate) fn build_elf(machine: u16, sections: &[(&str, u32, u32, u32, Vec<u8>)]) -> Vec<u8> {
        let mut names = vec![0u8];
        let mut name_offsets = Vec::new();
        for (name, ..) in sections.iter().chain(std::iter::once(&(".shstrtab", 3, 0, 0, Vec::new()))) {
            name_offsets.push(names.len() as u32);
            names.extend_from_slice(name.as_bytes());
            names.push(0);
        }
        let mut out = vec![0u8; EHDR_SIZE];
        let mut placed = Vec::new();
        for (_, _, _, _, bytes) in sections {
            placed.push((out.len() as u64, bytes.len() as u64));
            out.extend_from_slice(bytes);
        }
        placed.push((out.len() as u64, names.len() as u64));
        out.extend_from_slice(&names);
        while !out.len().is_multiple_of(8) {
            out.push(0);
        }
        let shoff = out.len() as u64;
        out.extend_from_slice(&[0u8; SHDR_SIZE]);
        let all: Vec<(u32, u32, u32)> =
            sections.iter().map(|(_, t, link, info, _)| (*t, *link, *info)).chain(std::iter::once((3, 0, 0))).collect();
        for (i, (sh_type, link, info)) in all.into_iter().enumerate() {
            let mut h = [0u8; SHDR_SIZE];
            h[0..4].copy_from_slice(&name_offsets[i].to_le_bytes());
            h[4..8].copy_from_slice(&sh_type.to_le_bytes());
            h[24..32].copy_from_slice(&placed[i].0.to_le_bytes());
            h[32..40].copy_from_slice(&placed[i].1.to_le_bytes());
            h[40..44].copy_from_slice(&link.to_le_bytes());
            h[44..48].copy_from_slice(&info.to_le_bytes());
            out.extend_from_slice(&h);
        }
        let shnum = sections.len() as u16 + 2;
        out[..4].copy_from_slice(b"\x7fELF");
        out[4] = 2;
        out[5] = 1;
        out[6] = 1;
        out[16..18].copy_from_slice(&1u16.to_le_bytes());
        out[18..20].copy_from_slice(&machine.to_le_bytes());
        out[40..48].copy_from_slice(&shoff.to_le_bytes());
        out[52..54].copy_from_slice(&(EHDR_SIZE as u16).to_le_bytes());
        out[58..60].copy_from_slice(&(SHDR_SIZE as u16).to_le_bytes());
        out[60..62].copy_from_slice(&shnum.to_le_bytes());
        out[62..64].copy_from_slice(&(shnum - 1).to_le_bytes());
        out
    }

    /// Section indices in images from [`build_elf`] are the position in `sections` plus one.
    fn symbol(name_offset: u32, info: u8, other: u8, shndx: u16) -> Vec<u8> {
        let mut s = vec![0u8; SYM_SIZE];
        s[0..4].copy_from_slice(&name_offset.to_le_bytes());
        s[4] = info;
        s[5] = other;
        s[6..8].copy_from_slice(&shndx.to_le_bytes());
        s
    }

    pub(crate) fn symtab(entries: &[(u32, u8, u8, u16)]) -> Vec<u8> {
        let mut out = symbol(0, 0, 0, 0);
        for &(name, info, other, shndx) in entries {
            out.extend(symbol(name, info, other, shndx));
        }
        out
    }

    #[test]
    fn parses_sections_and_symbols() {
        let strtab = b"\0kern\0helper\0".to_vec();
        let image = build_elf(
            EM_CUDA,
            &[
                (".strtab", 3, 0, 0, strtab),
                (".symtab", SHT_SYMTAB, 1, 0, symtab(&[(1, 0x12, STO_CUDA_ENTRY, 3), (6, 0x12, 0, 4)])),
                (".text.kern", 1, 0, 0, vec![0xaa; 16]),
                (".text.helper", 1, 0, 0, vec![0xbb; 8]),
            ],
        );
        let elf = Elf::parse(&image).unwrap();
        assert_eq!(elf.header().machine, EM_CUDA);
        let names: Vec<_> = elf.sections().iter().map(|s| s.name).collect();
        assert_eq!(names, ["", ".strtab", ".symtab", ".text.kern", ".text.helper", ".shstrtab"]);
        assert_eq!(elf.section(".text.kern").unwrap().data, &[0xaa; 16]);
        let symbols = elf.symbols().unwrap();
        assert_eq!(symbols.len(), 3);
        assert_eq!(
            (symbols[1].name, symbols[1].kind(), symbols[1].other, symbols[1].shndx),
            ("kern", STT_FUNC, 0x10, 3)
        );
        assert_eq!(symbols[2].name, "helper");
    }

    #[test]
    fn rejects_malformed_images() {
        assert!(matches!(Elf::parse(b"\x7fELF"), Err(FatbinError::Truncated { .. })));
        let good = build_elf(EM_CUDA, &[(".text.k", 1, 0, 0, vec![1, 2, 3])]);
        let mut bad_magic = good.clone();
        bad_magic[1] = b'X';
        assert!(matches!(Elf::parse(&bad_magic), Err(FatbinError::BadMagic { .. })));
        let mut class32 = good.clone();
        class32[4] = 1;
        assert!(matches!(Elf::parse(&class32), Err(FatbinError::Elf { offset: 4, .. })));
        let mut big_endian = good.clone();
        big_endian[5] = 2;
        assert!(matches!(Elf::parse(&big_endian), Err(FatbinError::Elf { offset: 5, .. })));
        // A section whose bytes run past the end of the file.
        let mut past_end = good.clone();
        let shoff = u64_at(&good, 40).unwrap() as usize;
        past_end[shoff + SHDR_SIZE + 32..shoff + SHDR_SIZE + 40].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(Elf::parse(&past_end), Err(FatbinError::Elf { .. })));
        // A section count far beyond the file's size is refused before allocating.
        let mut many = good.clone();
        many[60..62].copy_from_slice(&0xfff0u16.to_le_bytes());
        assert!(matches!(Elf::parse(&many), Err(FatbinError::Truncated { .. })));
        // Every prefix of a valid image is rejected or parsed, never a panic.
        for len in 0..good.len() {
            let _ = Elf::parse(&good[..len]);
        }
    }
}
