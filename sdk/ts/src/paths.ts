// Paths inside the sandbox: relative ones start from the user's home.

/** A home directory as the sandbox's /etc/passwd names it; hostile input, so checked. */
export function homeFromPasswd(passwd: string, user: string): string | undefined {
  for (const line of passwd.split("\n")) {
    const f = line.split(":");
    if (f.length >= 7 && f[0] === user) {
      const home = f[5]!;
      if (home.startsWith("/") && !home.includes("\0") && !home.split("/").includes("..")) return home;
      return undefined;
    }
  }
  return undefined;
}

/**
 * joinPath makes p absolute: "~" and relative paths start from home. The
 * server refuses paths with ".." outright; they are kept for it to say so.
 */
export function joinPath(home: string, p: string): string {
  if (p.startsWith("/")) return p;
  if (p === "~" || p === "" || p === ".") return home;
  if (p.startsWith("~/")) p = p.slice(2);
  if (p.startsWith("./")) p = p.slice(2);
  return home.replace(/\/+$/, "") + "/" + p;
}

