/** A home directory as the sandbox's /etc/passwd names it; hostile input, so checked. */
export declare function homeFromPasswd(passwd: string, user: string): string | undefined;
/**
 * joinPath makes p absolute: "~" and relative paths start from home. The
 * server refuses paths with ".." outright; they are kept for it to say so.
 */
export declare function joinPath(home: string, p: string): string;
