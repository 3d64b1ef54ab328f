"""What every package below the command line shares, private to the library: outputs written all or nothing
(``atomic``, with the proof of what hf-geonorm wrote: ``ownership``; one writer per folder: ``output_lock``), SIGTERM
and SIGINT handled while they are written (``signals``), child processes' environment (``children``), a full device
named alike whichever writer reports it (``full_device``), text read as UTF-8 (``text_files``), file checksums
(``checksums``), and how an options field declares its command-line option (``declarations``)."""
