"""What a record shares with the Hermes Agent's own batch runner (hermes-agent 0.19.0), so that a file
of each loads in one `datasets.load_dataset("json", data_files=[ours, theirs])` call: the names its
`tool_stats` and `tool_error_counts` are padded to (every tool of its registry, used or not). A record
of ours holds each of them too (zero here), beside this product's own tools: `datasets` takes a file's
struct fields from the first file it reads and fills the ones a later file lacks, never the reverse.

The other shared parts are typed alike by construction (build.py): `metadata.timestamp` an ISO string
with microseconds (Arrow reads one without them as a timestamp), the turns' `from` and `value`."""

from ..tools import ALL_TOOL_NAMES

REFERENCE_VERSION = "0.19.0"
REFERENCE_TOOL_NAMES: tuple[str, ...] = tuple("""
browser_back browser_cdp browser_click browser_console browser_dialog browser_get_images browser_navigate
browser_press browser_scroll browser_snapshot browser_type browser_vision clarify close_terminal computer_use
cronjob delegate_task discord discord_admin execute_code feishu_doc_read feishu_drive_add_comment
feishu_drive_list_comment_replies feishu_drive_list_comments feishu_drive_reply_comment ha_call_service
ha_get_state ha_list_entities ha_list_services image_generate kanban_attach kanban_attach_url kanban_attachments
kanban_block kanban_comment kanban_complete kanban_create kanban_heartbeat kanban_link kanban_list kanban_show
kanban_unblock memory patch process project_create project_list project_switch read_file read_terminal
search_files session_search skill_manage skill_view skills_list spotify_albums spotify_devices spotify_library
spotify_playback spotify_playlists spotify_queue spotify_search terminal text_to_speech todo video_analyze
video_generate vision_analyze web_extract web_search write_file x_search xai_video_edit xai_video_extend
yb_query_group_info yb_query_group_members yb_search_sticker yb_send_dm yb_send_sticker
""".split())
PADDING_ONLY = frozenset(REFERENCE_TOOL_NAMES) - set(ALL_TOOL_NAMES)  # its tools this runner never offers
