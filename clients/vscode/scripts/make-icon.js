// Writes media/icon.png (128x128): a GPU card on a dark tile. Run: node scripts/make-icon.js
"use strict";
const fs = require("node:fs");
const path = require("node:path");
const zlib = require("node:zlib");

const N = 128;
const px = Buffer.alloc(N * N * 4);
const set = (x, y, [r, g, b, a = 255]) => px.set([r, g, b, a], (y * N + x) * 4);
for (let y = 0; y < N; y++) {
  for (let x = 0; x < N; x++) {
    // A rounded dark tile.
    const cx = Math.max(16 - x, 0, x - (N - 17)), cy = Math.max(16 - y, 0, y - (N - 17));
    if (cx * cx + cy * cy > 16 * 16) { set(x, y, [0, 0, 0, 0]); continue; }
    set(x, y, [24, 32, 48]);
    // The card, its fan and its connector pins.
    const inCard = x >= 18 && x < 110 && y >= 40 && y < 88;
    const fx = x - 46, fy = y - 64;
    if (inCard) set(x, y, [118, 185, 0]);
    if (inCard && fx * fx + fy * fy < 17 * 17) set(x, y, fx * fy > 0 ? [40, 60, 20] : [70, 110, 10]);
    if (inCard && x >= 72 && x < 102 && y >= 50 && y < 78 && (y - 50) % 7 < 4) set(x, y, [40, 60, 20]);
    if (y >= 88 && y < 96 && x >= 30 && x < 98 && (x - 30) % 6 < 4) set(x, y, [230, 190, 60]);
  }
}
const rows = Buffer.concat(Array.from({ length: N }, (_, y) => Buffer.concat([Buffer.from([0]), px.subarray(y * N * 4, (y + 1) * N * 4)])));
const crcTable = Array.from({ length: 256 }, (_, n) => { let c = n; for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1; return c >>> 0; });
const crc = (buf) => { let c = 0xffffffff; for (const b of buf) c = crcTable[(c ^ b) & 0xff] ^ (c >>> 8); return (c ^ 0xffffffff) >>> 0; };
const chunk = (type, data) => {
  const len = Buffer.alloc(4); len.writeUInt32BE(data.length);
  const td = Buffer.concat([Buffer.from(type, "ascii"), data]);
  const c = Buffer.alloc(4); c.writeUInt32BE(crc(td));
  return Buffer.concat([len, td, c]);
};
const ihdr = Buffer.alloc(13);
ihdr.writeUInt32BE(N, 0); ihdr.writeUInt32BE(N, 4); ihdr.set([8, 6, 0, 0, 0], 8);
const png = Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), chunk("IHDR", ihdr), chunk("IDAT", zlib.deflateSync(rows, { level: 9 })), chunk("IEND", Buffer.alloc(0))]);
fs.writeFileSync(path.join(__dirname, "..", "media", "icon.png"), png);
