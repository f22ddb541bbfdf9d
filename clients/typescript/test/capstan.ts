import { fileURLToPath } from "node:url";

/** The repository's root, from dist/test. */
export const repoRoot = fileURLToPath(new URL("../../../../", import.meta.url));

/** The golden vectors shared with Go (internal/wirevectors/testdata). */
export const vectorsDir = fileURLToPath(new URL("../../../../internal/wirevectors/testdata/", import.meta.url));
